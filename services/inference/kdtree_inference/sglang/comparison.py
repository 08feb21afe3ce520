"""Kernel-vs-Triton error statistics kept on the device, so CUDA-graph replay keeps working.

Per layer the recorder holds, since the last publish:
  max_abs  = max |kernel - triton|
  max_rel  = max |kernel - triton| / (|triton| + floor_d)
  over     = count of elements with NOT(|kernel - triton| <= floor_d + rtol * |triton|)
             (torch.isclose's rule with a per-dimension atol; a NaN anywhere counts as over)
  compared = count of elements compared
where d is the element's latent dimension (its index modulo the value width) and
  floor_d  = atol * max(1, scale_d),  scale_d = the largest |value| of dimension d in the
             layer's KV pool (``refresh_value_scale``) and in the call's new rows (``new_values``);
             where either holds a NaN or inf in dimension d, that part counts as 0.
Both kernels round the attention weights to bf16 before the weights-times-values product, so
rounding one weight moves output dimension d by that rounding times a value of dimension d: on a
model whose latent values are several units in size, correct outputs differ by more than a fixed
atol. The floor therefore scales with the largest |value| the dimension could have read. That is
conservative (the pool also holds other requests' rows), and a never-refreshed scale (zeros) or
values of size <= 1 leave the plain atol, so small-valued models are judged as before.

Every update is an in-place tensor operation on preallocated buffers: no ``.item()``, no host
sync, nothing the capture could not record. An optional device-side ``gate`` (a 0-dim bool
tensor) turns an update into a no-op, which is how a captured graph runs the comparison only on
the steps the host selects (KDTREE_SHADOW_EVERY). The value scale is refreshed outside any graph,
in place, so a captured graph reads the refreshed scale on its next replay.

Reading the statistics back (``snapshot``) happens outside any graph, every N verify steps: an
asynchronous copy to host memory plus an event, consumed when the event has completed, so the
serving stream never waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Bytes of float8 codes masked per step of a value buffer's magnitude scan: bounds the temporary
# the sign-clearing allocates on a large pool.
_FP8_SCAN_BYTES = 64 << 20


@dataclass(frozen=True)
class LayerStats:
    layer_id: int
    max_abs: float
    max_rel: float
    over_tolerance: int
    compared: int


class _PendingSnapshot:
    def __init__(
        self, floats: torch.Tensor, counts: torch.Tensor, event: torch.cuda.Event | None
    ) -> None:
        self.floats = floats
        self.counts = counts
        self.event = event

    def ready(self) -> bool:
        return self.event is None or self.event.query()


def _finite(scale: torch.Tensor) -> torch.Tensor:
    """Non-finite magnitudes (a NaN or inf value) widen nothing: they leave the plain atol."""
    return torch.nan_to_num(scale, nan=0.0, posinf=0.0, neginf=0.0)


def _rows(values: torch.Tensor, value_dim: int) -> torch.Tensor:
    """``values`` as [rows, value_dim] (a view for the pool's [rows, 1, value_dim] layout)."""
    if values.shape[-1] != value_dim:
        raise ValueError(
            f"values of shape {tuple(values.shape)}: the last dimension must be the value "
            f"width {value_dim}"
        )
    return values.reshape(-1, value_dim)


def value_amax(values: torch.Tensor, value_dim: int) -> torch.Tensor:
    """max |values| per latent dimension over all rows, float32 [value_dim] (stream-ordered).

    For float8_e4m3fn (no amax kernel) the codes are scanned as uint8 with the sign bit cleared:
    for e4m3fn the magnitude's order is the code's order, 0x7F (NaN) the largest. A dimension
    holding a NaN comes out NaN (an inf, in float buffers, inf).
    """
    rows = _rows(values, value_dim)
    if rows.dtype == torch.float8_e4m3fn:
        codes = rows.view(torch.uint8)
        amax = torch.zeros(value_dim, dtype=torch.uint8, device=rows.device)
        step = max(1, _FP8_SCAN_BYTES // value_dim)
        for start in range(0, codes.shape[0], step):
            torch.maximum(amax, (codes[start : start + step] & 0x7F).amax(0), out=amax)
        return amax.view(torch.float8_e4m3fn).float()
    if rows.shape[0] == 0:
        return torch.zeros(value_dim, dtype=torch.float32, device=rows.device)
    # aminmax reads the buffer once and allocates no temporary of its size.
    low, high = torch.aminmax(rows, dim=0)
    return torch.maximum(high.float(), low.float().neg())


class ComparisonRecorder:
    """Per-layer error statistics of kernel output against the Triton output, on ``device``.

    ``value_dim`` is the width of one head's values (512 for MLA's latent): outputs are compared
    as [-1, value_dim], each dimension with its own absolute floor (see the module doc).
    """

    def __init__(
        self,
        num_layers: int,
        first_layer_id: int,
        device: torch.device,
        atol: float,
        rtol: float,
        *,
        value_dim: int,
    ) -> None:
        self.first_layer_id = first_layer_id
        self.num_layers = num_layers
        self.atol = atol
        self.rtol = rtol
        self.value_dim = value_dim
        self.device = torch.device(device)
        # [layer, (max_abs, max_rel)] float32 and [layer, (over, compared)] int64.
        self._floats = torch.zeros(num_layers, 2, dtype=torch.float32, device=self.device)
        self._counts = torch.zeros(num_layers, 2, dtype=torch.int64, device=self.device)
        # [layer, latent dimension]: the largest |value| in the layer's pool (0 until refreshed,
        # or where non-finite). Written in place only, so captured graphs keep reading it.
        self.value_scale = torch.zeros(
            num_layers, value_dim, dtype=torch.float32, device=self.device
        )
        self._pending: _PendingSnapshot | None = None

    def _row(self, layer_id: int) -> int:
        row = layer_id - self.first_layer_id
        if not 0 <= row < self.num_layers:
            raise IndexError(
                f"layer {layer_id} is outside this KV pool's layers "
                f"[{self.first_layer_id}, {self.first_layer_id + self.num_layers})"
            )
        return row

    def refresh_value_scale(
        self, layer_id: int, value_buffer: torch.Tensor, v_scale: float = 1.0
    ) -> None:
        """Outside any graph: the layer's scale := max |value| per dimension of ``value_buffer``.

        ``value_buffer`` is the KV pool's value view for the layer ([rows, (1,) value_dim],
        bf16/fp16 or float8_e4m3fn) and ``v_scale`` what its stored values are multiplied by
        when read. Stream-ordered, no host sync; written in place.
        """
        row = self._row(layer_id)
        scale = value_amax(value_buffer, self.value_dim).mul_(v_scale)
        self.value_scale[row].copy_(_finite(scale))

    def _floor(self, row: int, new_values: torch.Tensor | None) -> torch.Tensor:
        """The absolute tolerance per latent dimension, float32 [value_dim] (graph-safe)."""
        scale = self.value_scale[row]
        if new_values is not None:
            fresh = _rows(new_values.detach(), self.value_dim).abs().amax(0).float()
            scale = torch.maximum(scale, _finite(fresh))
        return scale.clamp(min=1.0).mul_(self.atol)

    def record(
        self,
        layer_id: int,
        kernel_out: torch.Tensor,
        triton_out: torch.Tensor,
        gate: torch.Tensor | None = None,
        new_values: torch.Tensor | None = None,
    ) -> None:
        """Fold one layer call's difference into the layer's running statistics (graph-safe).

        The outputs' last dimension is heads x ``value_dim`` (or ``value_dim``); ``new_values``
        are the values of the rows this call adds to the pool ([rows, (1,) value_dim]), which
        the last refresh has not seen.
        """
        row = self._row(layer_id)
        for out in (kernel_out, triton_out):
            if out.dim() == 0 or out.shape[-1] % self.value_dim:
                raise ValueError(
                    f"an output of shape {tuple(out.shape)}: its last dimension must be a "
                    f"multiple of the value width {self.value_dim}"
                )
        floor = self._floor(row, new_values)
        reference = triton_out.float().reshape(-1, self.value_dim)
        diff = (kernel_out.float().reshape(-1, self.value_dim) - reference).abs()
        magnitude = reference.abs()
        max_abs = diff.amax() if diff.numel() else diff.new_zeros(())
        max_rel = (diff / (magnitude + floor)).amax() if diff.numel() else diff.new_zeros(())
        over = (~(diff <= floor + self.rtol * magnitude)).sum()
        compared = torch.full((), diff.numel(), dtype=torch.int64, device=diff.device)
        if gate is not None:
            # where(), not a multiply: an ungated step may compare against uninitialised memory.
            zero_f = torch.zeros((), dtype=torch.float32, device=diff.device)
            zero_i = torch.zeros((), dtype=torch.int64, device=diff.device)
            max_abs = torch.where(gate, max_abs, zero_f)
            max_rel = torch.where(gate, max_rel, zero_f)
            over = torch.where(gate, over, zero_i)
            compared = torch.where(gate, compared, zero_i)
        floats = self._floats[row]
        # fmax semantics would drop NaN; maximum keeps it, so a NaN kernel output stays visible.
        torch.maximum(floats, torch.stack([max_abs, max_rel]), out=floats)
        self._counts[row] += torch.stack([over, compared])

    def snapshot(self) -> None:
        """Start copying the statistics to the host and reset them (stream-ordered, no sync)."""
        if self.device.type == "cuda":
            floats = torch.empty(self._floats.shape, dtype=torch.float32, pin_memory=True)
            counts = torch.empty(self._counts.shape, dtype=torch.int64, pin_memory=True)
            floats.copy_(self._floats, non_blocking=True)
            counts.copy_(self._counts, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            floats, counts, event = self._floats.clone(), self._counts.clone(), None
        self._floats.zero_()
        self._counts.zero_()
        self._pending = _PendingSnapshot(floats, counts, event)

    def collect(self) -> list[LayerStats] | None:
        """The last snapshot's per-layer statistics once its copy has landed, else None.

        Only layers that compared at least one element are listed.
        """
        pending = self._pending
        if pending is None or not pending.ready():
            return None
        self._pending = None
        floats, counts = pending.floats.tolist(), pending.counts.tolist()
        return [
            LayerStats(
                layer_id=self.first_layer_id + row,
                max_abs=floats[row][0],
                max_rel=floats[row][1],
                over_tolerance=int(counts[row][0]),
                compared=int(counts[row][1]),
            )
            for row in range(self.num_layers)
            if counts[row][1] > 0
        ]


class ShadowGate:
    """The device-side switch and metadata that let a captured graph run Triton only sometimes.

    When a graph is captured in ``on`` mode with shadowing, the Triton comparison is recorded
    into it once and replayed every step. On steps the host does not select, ``open`` is False
    and the Triton call is pointed at all-zero ``qo_indptr``/``kv_indptr`` (every request has no
    query rows and no prefix), so its programs exit at once and the recorder ignores the output.
    """

    def __init__(self, max_batch_size: int, device: torch.device) -> None:
        self.open = torch.zeros((), dtype=torch.bool, device=device)
        self.qo_indptr = torch.zeros(max_batch_size + 1, dtype=torch.int64, device=device)
        self.kv_indptr = torch.zeros(max_batch_size + 1, dtype=torch.int64, device=device)

    def set(self, enabled: bool, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> None:
        """Outside the graph, before replay: select (or not) this step for comparison."""
        batch = qo_indptr.shape[0]
        self.open.fill_(enabled)
        if enabled:
            self.qo_indptr[:batch].copy_(qo_indptr)
            self.kv_indptr[:batch].copy_(kv_indptr)
        else:
            self.qo_indptr.zero_()
            self.kv_indptr.zero_()


class VerifyComparison:
    """The comparison a backend runs in validate mode or with the shadow: the kernel-vs-Triton
    recorder and, in validate mode with an fp8 pool, each side's recorder against the exact
    computation on the stored values; published through the backend's telemetry."""

    EXACT_SIDES = ("triton", "kdtree")

    def __init__(
        self,
        telemetry: Any,
        *,
        num_layers: int,
        first_layer_id: int,
        device: torch.device,
        atol: float,
        rtol: float,
        value_dim: int,
        validate_every: int,
        vs_exact: bool,
    ) -> None:
        def recorder() -> ComparisonRecorder:
            return ComparisonRecorder(
                num_layers=num_layers,
                first_layer_id=first_layer_id,
                device=device,
                atol=atol,
                rtol=rtol,
                value_dim=value_dim,
            )

        self.telemetry = telemetry
        self.device = device
        self.validate_every = validate_every
        self.recorder = recorder()
        # side -> its error against the exact computation (the kernel's fp16-operand mode).
        self.exact_recorders: dict[str, ComparisonRecorder] = (
            {side: recorder() for side in self.EXACT_SIDES} if vs_exact else {}
        )

    def refresh_value_scales(
        self,
        value_buffer: Callable[[int], torch.Tensor],
        v_scale: Callable[[int], float | None],
    ) -> None:
        """Outside any graph, before a forward that compares: every recorder's value scale from
        the pool's value buffers (``value_buffer(layer_id)``), read times ``v_scale(layer_id)``.

        A layer whose ``v_scale`` is None (not known yet) keeps its scale.
        """
        recorder = self.recorder
        first = recorder.first_layer_id
        for layer_id in range(first, first + recorder.num_layers):
            scale = v_scale(layer_id)
            if scale is not None:
                recorder.refresh_value_scale(layer_id, value_buffer(layer_id), scale)
        for exact in self.exact_recorders.values():  # the same pool: copy, don't rescan
            exact.value_scale.copy_(recorder.value_scale)

    def publish(self, step: int) -> None:
        """Outside any graph: report a finished snapshot; start a new one every N steps."""
        self._publish(step)
        if step % self.validate_every == 0:
            self._snapshot()

    def flush(self, step: int) -> None:
        """Publish what has been recorded so far (waits for the device; not for the hot path)."""
        self._snapshot()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._publish(step)

    def _snapshot(self) -> None:
        self.recorder.snapshot()
        for exact in self.exact_recorders.values():
            exact.snapshot()

    def _publish(self, step: int) -> None:
        stats = self.recorder.collect()
        if stats is not None:
            self.telemetry.publish(step, stats)
        collected = {side: r.collect() for side, r in self.exact_recorders.items()}
        if collected and all(stats is not None for stats in collected.values()):
            self.telemetry.publish_vs_exact(step, collected)
