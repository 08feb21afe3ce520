"""``KdtreeTritonAttnBackend``: SGLang's Triton attention backend with target verify on the kdtree
kernel (and, in EAGLE's draft runner, the draft-extend forward: the same attention over the
committed prefix plus the new tokens, with a causal mask instead of the tree).

It overrides three methods of SGLang 0.5.23's ``TritonAttnBackend`` and nothing else:

- ``init_forward_metadata`` (eager) and ``init_forward_metadata_out_graph`` (CUDA-graph capture
  and, before every replay, outside the graph): after the parent fills its metadata, a verify
  forward is marshaled once for all layers (``marshal``), counted, the comparison window is
  published every KDTREE_VALIDATE_EVERY steps, and the shadow step is selected;
- ``forward_extend``: on the forward this backend serves and a layer the kernel supports, the mode
  decides; every other call (prefill, unsupported layers) is the parent's, untouched.

Which forward a backend serves follows its model runner: the target runner's is target verify
(``TARGET_VERIFY``); a draft runner's is EAGLE's draft extend (``DRAFT_EXTEND_V2``: each request's
``num_draft_tokens`` new tokens over its committed prefix, in the verify layout with no mask),
unless KDTREE_DRAFT_EXTEND=off keeps it stock. The draft's own decode steps stay on Triton.

Modes (``modes``): ``off`` is the parent, bit for bit; ``validate`` runs the parent (which also
saves the KV cache), then the kernel, records the difference on the device and returns the
parent's output; ``on`` saves the KV cache as the parent does, returns the kernel's output and,
with KDTREE_SHADOW_EVERY=N, runs the parent's Triton kernel on every Nth step for comparison.

Fallbacks are counted per layer call by reason. Layer calls that CUDA-graph replays make never
reach Python, so the routes taken while a graph is captured are remembered per batch size and
counted again on each replay of that graph.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from typing import Any, assert_never

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from kdtree_verify import QK_DIM, V_DIM, VerifyInputError
from kdtree_verify.validation import FP8_KV_DTYPE

from ..faults import banner, scaled_softmax
from .comparison import ComparisonRecorder, ShadowGate, VerifyComparison
from .dispatch import verify_with_inputs
from .extension import kernel_status
from .fault_injection import faulty_inputs
from .forward_state import KdtreeForward, Phase
from .marshal import VerifyInputs, VerifyMarshal
from .modes import Role, VerifyMode, VerifySettings
from .telemetry import VerifyTelemetry

logger = logging.getLogger("kdtree.verify")

# Like the parent's kernels (wrapped in torch.compiler.disable in its __init__): under
# --enable-torch-compile the kernel call and the host-side bookkeeping stay out of the trace.
_verify_layer = torch.compiler.disable(verify_with_inputs)

KERNEL_ROUTE = "kernel"
# dtypes the kernel computes in, per device type (the CPU op also runs float32, which is what the
# CPU tests compare against SGLang's interpreted Triton kernel).
KERNEL_DTYPES = {
    "cuda": (torch.bfloat16, torch.float16),
    "cpu": (torch.float32, torch.bfloat16, torch.float16),
}


def _descales(layer: Any) -> tuple[float, float]:
    """The parent's k_descale / v_descale: the layer's scales when it has both, else 1.0."""
    if layer.k_scale is not None and layer.v_scale is not None:
        return layer.k_scale_float, layer.v_scale_float
    return 1.0, 1.0


class KdtreeTritonAttnBackend(TritonAttnBackend):
    """SGLang's "triton" attention backend, with target verify served per KDTREE_VERIFY."""

    def __init__(
        self,
        model_runner: Any,
        *args: Any,
        kdtree_settings: VerifySettings | None = None,
        kdtree_registry: Any | None = None,
        **kwargs: Any,
    ) -> None:
        """As the parent; ``kdtree_settings`` default to the environment's, ``kdtree_registry``
        (a prometheus_client registry) to the process default."""
        super().__init__(model_runner, *args, **kwargs)
        self._init_kdtree(model_runner, kdtree_settings, kdtree_registry)

    # ----------------------------------------------------------------------------- set-up

    def _init_kdtree(
        self,
        model_runner: Any,
        settings: VerifySettings | None = None,
        registry: Any | None = None,
    ) -> None:
        """Our state, set up after the parent's ``__init__``."""
        settings = settings or VerifySettings.from_env()
        self.kdtree_settings = settings = settings.resolved_for_pool(
            self.token_to_kv_pool.dtype == FP8_KV_DTYPE
        )
        self.kdtree_device = torch.device(self.device)
        is_draft = bool(getattr(model_runner, "is_draft_worker", False))
        self.kdtree_role = Role.DRAFT_EXTEND if is_draft else Role.TARGET_VERIFY
        self.kdtree_active = settings.mode is not VerifyMode.OFF and (
            settings.draft_extend or not is_draft
        )
        if self.kdtree_active:
            self._kdtree_require_kernel()
        self.kdtree_telemetry = VerifyTelemetry(
            settings,
            tp_rank=getattr(model_runner, "tp_rank", 0),
            registry=registry,
            role=self.kdtree_role,
        )
        self.kdtree_comparison = self._kdtree_build_comparison()
        self.kdtree_shadow_gate = (
            ShadowGate(self.req_to_token_pool.size, self.kdtree_device)
            if self.kdtree_active and settings.mode is VerifyMode.ON and settings.shadow_every
            else None
        )
        self.kdtree_marshal = VerifyMarshal(
            self.kdtree_device, self.num_head, self.token_to_kv_pool.dtype
        )
        self._kdtree_init_forward_state()
        # A fault edits target verify only (never the draft runner's draft extend).
        self.kdtree_fault = settings.fault if self.kdtree_active and not is_draft else None
        self._kdtree_log_set_up(is_draft)

    def _kdtree_require_kernel(self) -> None:
        status = kernel_status(self.kdtree_device)
        if not status.usable:
            raise RuntimeError(
                f"KDTREE_VERIFY={self.kdtree_settings.mode.value} needs the kdtree verify kernel, "
                f"but {status.detail}. Set KDTREE_VERIFY=off to serve with SGLang's Triton "
                "kernel only."
            )

    def _kdtree_build_comparison(self) -> VerifyComparison | None:
        """The comparison, when any forward of this backend runs one."""
        settings = self.kdtree_settings
        if not (self.kdtree_active and settings.compares):
            return None
        pool = self.token_to_kv_pool
        return VerifyComparison(
            self.kdtree_telemetry,
            num_layers=pool.layer_num,
            first_layer_id=getattr(pool, "start_layer", 0) or 0,
            device=self.kdtree_device,
            atol=settings.atol,
            rtol=settings.rtol,
            value_dim=V_DIM,
            validate_every=settings.validate_every,
            # Validate with an fp8 pool: each side's error against the exact computation on the
            # stored values (the kernel's fp16-operand mode), so an operator sees which is closer.
            vs_exact=settings.mode is VerifyMode.VALIDATE and pool.dtype == FP8_KV_DTYPE,
        )

    def _kdtree_init_forward_state(self) -> None:
        # batch size of a captured verify graph -> the inputs its kernel calls reference.
        self._kdtree_graph_inputs: dict[int, VerifyInputs] = {}
        self.kdtree_step = 0
        self.kdtree_forward = KdtreeForward()  # replaced by each verify forward's metadata
        self._kdtree_capture_key: int | None = None
        self._kdtree_shadow_now = False
        # batch size of a captured graph -> {layer_id: route}; route = "kernel" or a reason.
        self._kdtree_graph_routes: dict[int, dict[int, str]] = {}
        self._kdtree_reason_cache: dict[tuple[int, torch.dtype], str | None] = {}
        # layer_id -> what the kernel multiplies the layer's stored values by (its v_descale),
        # noted where the kernel takes it; the comparison's value scale needs it.
        self._kdtree_v_scales: dict[int, float] = {}

    def _kdtree_log_set_up(self, is_draft: bool) -> None:
        # The pid shows which process built the backend: a scheduler, never the launcher.
        if not is_draft:
            served = "target"
        else:
            served = "draft runner, draft extend" if self.kdtree_active else "draft runner, stock"
        logger.info(
            "kdtree verify backend (%s) in pid %d: %s",
            served,
            os.getpid(),
            self.kdtree_settings.describe(),
        )
        if self.kdtree_fault is not None:
            logger.warning(
                banner(self.kdtree_fault, f"the SGLang verify backend (pid {os.getpid()})")
            )

    @property
    def kdtree_recorder(self) -> ComparisonRecorder | None:
        """The kernel-vs-Triton recorder, None when nothing is compared."""
        comparison = self.kdtree_comparison
        return comparison.recorder if comparison is not None else None

    @property
    def kdtree_exact_recorders(self) -> dict[str, ComparisonRecorder]:
        """Side -> its recorder against the exact computation (validate with an fp8 pool)."""
        comparison = self.kdtree_comparison
        return comparison.exact_recorders if comparison is not None else {}

    def _kdtree_serves(self, forward_mode: Any) -> bool:
        """Whether this backend's mode decides ``forward_mode``'s attention (see module doc)."""
        if not self.kdtree_active:
            return False
        if self.kdtree_role is Role.DRAFT_EXTEND:
            return forward_mode.is_draft_extend_v2()
        return forward_mode.is_target_verify()

    # ---------------------------------------------------------------- per-forward metadata

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)
        if self._kdtree_serves(forward_batch.forward_mode):
            self._kdtree_begin_forward(Phase.EAGER, batch_size=None)

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False):
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        if self._kdtree_serves(forward_batch.forward_mode):
            # The graph's batch size as the parent reads it: SGLang's draft-extend graph runner
            # hands over its whole req_pool_indices buffer, longer than the batch.
            self._kdtree_begin_forward(
                Phase.CAPTURE if in_capture else Phase.REPLAY,
                batch_size=forward_batch.batch_size,
            )

    def _kdtree_begin_forward(self, phase: Phase, batch_size: int | None) -> None:
        """Once per verify forward, after the parent's metadata: marshal, count, publish, gate."""
        if phase is Phase.REPLAY:
            # The captured calls keep the inputs they were captured with.
            self.kdtree_forward.phase = phase
        else:
            metadata = self.forward_metadata
            forward = KdtreeForward(phase, metadata)
            forward.inputs = faulty_inputs(
                self.kdtree_marshal.build(metadata, for_graph=phase is Phase.CAPTURE),
                self.kdtree_fault,
                phase,
            )
            if phase is Phase.CAPTURE:
                self._kdtree_graph_inputs[batch_size] = forward.inputs
            if self.kdtree_shadow_gate is not None and phase is Phase.CAPTURE:
                batch = metadata.qo_indptr.shape[0]
                forward.shadow_metadata = dataclasses.replace(
                    metadata,
                    qo_indptr=self.kdtree_shadow_gate.qo_indptr[:batch],
                    kv_indptr=self.kdtree_shadow_gate.kv_indptr[:batch],
                )
            self.kdtree_forward = forward
        if phase is Phase.CAPTURE:
            # Capture runs (warm-ups included) are not serving steps: record routes only.
            self._kdtree_capture_key = batch_size
            self._kdtree_graph_routes[batch_size] = {}
            if self.kdtree_shadow_gate is not None:
                self.kdtree_shadow_gate.set(False, self.qo_indptr[:1], self.kv_indptr[:1])
            return

        self.kdtree_step += 1
        self.kdtree_telemetry.verify_steps(graph_replay=phase is Phase.REPLAY)
        shadow_every = self.kdtree_settings.shadow_every
        self._kdtree_shadow_now = bool(shadow_every) and self.kdtree_step % shadow_every == 0
        self._kdtree_refresh_value_scales()
        if phase is Phase.REPLAY:
            self._kdtree_refresh_plan(batch_size)
            self._kdtree_count_replay(batch_size)
            if self.kdtree_shadow_gate is not None:
                rows = batch_size + 1
                self.kdtree_shadow_gate.set(
                    self._kdtree_shadow_now, self.qo_indptr[:rows], self.kv_indptr[:rows]
                )
        self._kdtree_publish()

    def _kdtree_refresh_value_scales(self) -> None:
        """Before a forward that compares (every validate step, a shadowed ``on`` step): the
        recorders' per-dimension value scales from this backend's KV pool, outside any graph.

        Only those steps pay for the scan; the rows this forward adds are covered in ``record``
        by its ``new_values``.
        """
        comparison = self.kdtree_comparison
        if comparison is None or not (
            self.kdtree_settings.mode is VerifyMode.VALIDATE or self._kdtree_shadow_now
        ):
            return
        comparison.refresh_value_scales(
            self.token_to_kv_pool.get_value_buffer, self._kdtree_value_read_scale
        )

    def _kdtree_value_read_scale(self, layer_id: int) -> float | None:
        """What the kernel multiplies layer ``layer_id``'s stored values by; None if not known.

        With an fp8 pool the stored values are V / v_scale and the kernel reads them times the
        layer's v_scale, noted when the kernel first serves the layer (before that: None, the layer's
        scale is left as it is). A pool of the compute dtype is served only unscaled
        (``_kdtree_layer_reason``), so there it is 1.0.
        """
        known = self._kdtree_v_scales.get(layer_id)
        if known is not None or self.token_to_kv_pool.dtype == FP8_KV_DTYPE:
            return known
        return 1.0

    def _kdtree_refresh_plan(self, batch_size: int) -> None:
        """Re-plan the captured kernel calls from the static buffers the parent just refilled."""
        captured = self._kdtree_graph_inputs.get(batch_size)
        if captured is None or captured.plan is None:
            return
        rows = batch_size + 1
        self.kdtree_marshal.refresh(
            batch_size,
            captured.total_tokens,
            self.qo_indptr[:rows],
            self.kv_indptr[:rows],
            self.mask_indptr[:rows] if captured.mask_indptr is not None else None,
        )

    def _kdtree_count_replay(self, batch_size: int) -> None:
        routes = self._kdtree_graph_routes.get(batch_size)
        if routes is None:
            logger.debug("kdtree: replay of a verify graph (bs=%d) captured before us", batch_size)
            return
        # One counter update per route, not one per layer: each is a locked file write under
        # SGLang's multiprocess metrics.
        for route, calls in Counter(routes.values()).items():
            if route == KERNEL_ROUTE:
                self.kdtree_telemetry.kernel_calls(calls)
            else:
                self.kdtree_telemetry.fallbacks(route, calls)

    def _kdtree_publish(self) -> None:
        """Outside any graph: report a finished snapshot; start a new one every N steps."""
        if self.kdtree_comparison is not None:
            self.kdtree_comparison.publish(self.kdtree_step)

    def kdtree_flush(self) -> None:
        """Publish what has been recorded so far (waits for the device; not for the hot path)."""
        if self.kdtree_comparison is not None:
            self.kdtree_comparison.flush(self.kdtree_step)

    # ------------------------------------------------------------------------- per layer

    def _kdtree_unsupported_reason(
        self, q: torch.Tensor, k: Any, v: Any, layer: Any, sinks: Any, score_mod: Any, aux: Any
    ) -> str | None:
        """Why the kernel cannot serve this layer call, or None if it can."""
        if k is None or v is None:
            return "no_draft_kv"
        inputs = self.kdtree_forward.inputs_for(self.forward_metadata)
        if inputs is not None and q.shape[0] != inputs.total_tokens:
            # The plan is sized for N tokens per request; ragged extends are Triton's.
            return "token_count"
        if sinks is not None:
            return "sinks"
        if score_mod is not None or aux is not None:
            return "score_mod"
        key = (layer.layer_id, q.dtype)
        if key not in self._kdtree_reason_cache:
            self._kdtree_reason_cache[key] = self._kdtree_layer_reason(q.dtype, layer)
        return self._kdtree_reason_cache[key]

    def _kdtree_layer_reason(self, dtype: torch.dtype, layer: Any) -> str | None:
        if not (
            self.use_mla
            and layer.qk_head_dim == QK_DIM
            and layer.v_head_dim == V_DIM
            and layer.tp_k_head_num == 1
        ):
            return "non_mla"
        if self.dllm_attention is not None:
            return "dllm"
        if self.dcp_size > 1:
            return "dcp"
        if self.page_size > 1:
            return "page_size"
        kv_dtype = self.token_to_kv_pool.get_key_buffer(layer.layer_id).dtype
        if kv_dtype != FP8_KV_DTYPE:
            if kv_dtype != dtype:
                return "kv_dtype"
            if layer.k_scale is not None:  # K / k_scale in a pool of q's dtype: not served
                return "kv_scale"
        if self.use_sliding_window_kv_pool or (
            layer.sliding_window_size is not None and layer.sliding_window_size > -1
        ):
            return "sliding_window"
        if layer.logit_cap and layer.logit_cap > 0:
            return "logit_cap"
        if layer.xai_temperature_len is not None and layer.xai_temperature_len > 0:
            return "xai_temperature"
        if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
            return "non_causal"
        if dtype not in KERNEL_DTYPES.get(self.kdtree_device.type, ()):
            return "dtype"
        return None

    @torch.compiler.disable
    def _kdtree_note_route(self, layer_id: int, route: str) -> None:
        if self.kdtree_forward.phase is Phase.CAPTURE:
            self._kdtree_graph_routes[self._kdtree_capture_key][layer_id] = route
        elif route == KERNEL_ROUTE:
            self.kdtree_telemetry.kernel_calls()
        else:
            self.kdtree_telemetry.fallbacks(route)

    def _kdtree_inputs(self) -> VerifyInputs:
        inputs = self.kdtree_forward.inputs_for(self.forward_metadata)
        if inputs is None:  # metadata built by a path that bypassed our hooks
            inputs = self.kdtree_marshal.build(self.forward_metadata)
            self.kdtree_forward = KdtreeForward(
                self.kdtree_forward.phase, self.forward_metadata, inputs
            )
        return inputs

    def _kdtree_kernel(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Any,
        fp8_numerics: str | None = None,
    ):
        k_scale, v_scale = _descales(layer)
        self._kdtree_v_scales[layer.layer_id] = v_scale
        out = _verify_layer(
            self._kdtree_inputs(),
            q.view(-1, layer.tp_q_head_num, QK_DIM),
            k.view(-1, 1, QK_DIM),
            v.view(-1, 1, V_DIM),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            scaled_softmax(self.kdtree_fault, layer.scaling),
            k_scale=k_scale,
            v_scale=v_scale,
            fp8_numerics=fp8_numerics or self.kdtree_settings.fp8_numerics,
        )
        return out.view(out.shape[0], -1)

    def _kdtree_triton(self, q, k, v, layer, forward_batch, save_kv_cache: bool):
        """The parent's computation; on a captured on-mode graph, gated by the shadow switch."""
        shadow_metadata = self.kdtree_forward.shadow_metadata_for(self.forward_metadata)
        if self.kdtree_forward.phase is not Phase.CAPTURE or shadow_metadata is None:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        metadata, self.forward_metadata = self.forward_metadata, shadow_metadata
        try:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        finally:
            self.forward_metadata = metadata

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool = True,
        sinks: Any = None,
        score_mod: Any = None,
        aux_tensors: Any = None,
    ):
        if not self._kdtree_serves(forward_batch.forward_mode):
            return super().forward_extend(
                q, k, v, layer, forward_batch, save_kv_cache, sinks, score_mod, aux_tensors
            )
        reason = self._kdtree_unsupported_reason(q, k, v, layer, sinks, score_mod, aux_tensors)
        if reason is not None:
            self._kdtree_note_route(layer.layer_id, reason)
            return super().forward_extend(
                q, k, v, layer, forward_batch, save_kv_cache, sinks, score_mod, aux_tensors
            )
        mode = self.kdtree_settings.mode
        match mode:
            case VerifyMode.VALIDATE:
                return self._kdtree_validate(q, k, v, layer, forward_batch, save_kv_cache)
            case VerifyMode.ON:
                return self._kdtree_serve(q, k, v, layer, forward_batch, save_kv_cache)
            case VerifyMode.OFF:  # not reached: an off backend serves nothing (_kdtree_serves)
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
            case _:
                assert_never(mode)

    def _kdtree_validate(self, q, k, v, layer, forward_batch, save_kv_cache):
        served = super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        try:
            kernel_out = self._kdtree_kernel(q, k, v, layer)
        except VerifyInputError:
            logger.exception("kdtree: the verify op rejected layer %d's inputs", layer.layer_id)
            self._kdtree_note_route(layer.layer_id, "invalid_inputs")
            return served
        self._kdtree_note_route(layer.layer_id, KERNEL_ROUTE)
        new_values = v.view(-1, V_DIM)
        self.kdtree_recorder.record(layer.layer_id, kernel_out, served, new_values=new_values)
        if self.kdtree_exact_recorders:
            exact = (
                kernel_out
                if self.kdtree_settings.fp8_numerics == "fp16"
                else self._kdtree_kernel(q, k, v, layer, fp8_numerics="fp16")
            )
            for side, out in (("triton", served), ("kdtree", kernel_out)):
                self.kdtree_exact_recorders[side].record(
                    layer.layer_id, out, exact, new_values=new_values
                )
        return served

    def _kdtree_serve(self, q, k, v, layer, forward_batch, save_kv_cache):
        if save_kv_cache:
            # The parent's write for MLA without DCP (checked above): K / k_scale when the layer
            # has a k_scale (only with an fp8 pool here), the pool casting to its dtype.
            loc = KVWriteLoc.for_batch(
                forward_batch, swa_loc=self.forward_metadata.swa_out_cache_loc
            )
            if layer.k_scale is None:
                self._set_kv_buffer(forward_batch, layer, loc, k, v)
            else:
                self.token_to_kv_pool.set_kv_buffer(layer, loc, k.clone().div_(layer.k_scale), v)
        try:
            kernel_out = self._kdtree_kernel(q, k, v, layer)
        except VerifyInputError:
            logger.exception("kdtree: the verify op rejected layer %d's inputs", layer.layer_id)
            self._kdtree_note_route(layer.layer_id, "invalid_inputs")
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache=False)
        self._kdtree_note_route(layer.layer_id, KERNEL_ROUTE)
        gate = self.kdtree_shadow_gate
        capturing = self.kdtree_forward.phase is Phase.CAPTURE
        if self.kdtree_recorder is not None and (
            self._kdtree_shadow_now or (capturing and gate is not None)
        ):
            triton_out = self._kdtree_triton(q, k, v, layer, forward_batch, save_kv_cache=False)
            self.kdtree_recorder.record(
                layer.layer_id,
                kernel_out,
                triton_out,
                gate=gate.open if capturing and gate is not None else None,
                new_values=v.view(-1, V_DIM),
            )
        attn_out = getattr(forward_batch, "_attn_output", None)
        if attn_out is not None:
            attn_out.view_as(kernel_out).copy_(kernel_out)
            return attn_out
        return kernel_out
