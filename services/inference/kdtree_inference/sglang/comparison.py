"""Kernel-vs-Triton error statistics kept on the device, so CUDA-graph replay keeps working.

Per layer the recorder holds, since the last publish:
  max_abs  = max |kernel - triton|
  max_rel  = max |kernel - triton| / (|triton| + atol)   (atol keeps near-zero outputs from
             turning rounding noise into huge ratios)
  over     = count of elements with NOT(|kernel - triton| <= atol + rtol * |triton|)
             (torch.isclose's rule; a NaN anywhere counts as over tolerance)
  compared = count of elements compared
Every update is an in-place tensor operation on preallocated buffers: no ``.item()``, no host
sync, nothing the capture could not record. An optional device-side ``gate`` (a 0-dim bool
tensor) turns an update into a no-op, which is how a captured graph runs the comparison only on
the steps the host selects (KDTREE_SHADOW_EVERY).

Reading the statistics back (``snapshot``) happens outside any graph, every N verify steps: an
asynchronous copy to host memory plus an event, consumed when the event has completed, so the
serving stream never waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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


class ComparisonRecorder:
    """Per-layer error statistics of kernel output against the Triton output, on ``device``."""

    def __init__(
        self, num_layers: int, first_layer_id: int, device: torch.device, atol: float, rtol: float
    ) -> None:
        self.first_layer_id = first_layer_id
        self.num_layers = num_layers
        self.atol = atol
        self.rtol = rtol
        self.device = torch.device(device)
        # [layer, (max_abs, max_rel)] float32 and [layer, (over, compared)] int64.
        self._floats = torch.zeros(num_layers, 2, dtype=torch.float32, device=self.device)
        self._counts = torch.zeros(num_layers, 2, dtype=torch.int64, device=self.device)
        self._pending: _PendingSnapshot | None = None

    def _row(self, layer_id: int) -> int:
        row = layer_id - self.first_layer_id
        if not 0 <= row < self.num_layers:
            raise IndexError(
                f"layer {layer_id} is outside this KV pool's layers "
                f"[{self.first_layer_id}, {self.first_layer_id + self.num_layers})"
            )
        return row

    def record(
        self,
        layer_id: int,
        kernel_out: torch.Tensor,
        triton_out: torch.Tensor,
        gate: torch.Tensor | None = None,
    ) -> None:
        """Fold one layer call's difference into the layer's running statistics (graph-safe)."""
        row = self._row(layer_id)
        reference = triton_out.float().reshape(-1)
        diff = (kernel_out.float().reshape(-1) - reference).abs()
        magnitude = reference.abs()
        max_abs = diff.amax() if diff.numel() else diff.new_zeros(())
        max_rel = (diff / (magnitude + self.atol)).amax() if diff.numel() else diff.new_zeros(())
        over = (~(diff <= self.atol + self.rtol * magnitude)).sum()
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
            )

        self.telemetry = telemetry
        self.device = device
        self.validate_every = validate_every
        self.recorder = recorder()
        # side -> its error against the exact computation (the kernel's fp16-operand mode).
        self.exact_recorders: dict[str, ComparisonRecorder] = (
            {side: recorder() for side in self.EXACT_SIDES} if vs_exact else {}
        )

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
