"""Attention backends of the engine, all called with SGLang 0.5.23's target-verify layout.

Every forward of the engine (prefill, plain decode and tree verify) is one ``extend`` in SGLang's
sense: T new tokens per request attend to the request's committed prefix, addressed through
``kv_indptr`` / ``kv_indices`` into the paged pool, plus the new tokens themselves, passed as
``k_extend`` / ``v_extend`` (and already written to their ``out_cache_loc`` slots). Within the new
tokens a flat ``custom_mask`` (row stride prefix + N) gives the tree; ``None`` means causal, which
is what prefill and plain decode use. One code path therefore serves all three, and the verify op
sees exactly the layout SGLang's TritonAttnBackend.forward_extend would hand it.

Backends: ``reference`` (kdtree_verify.verify_attention_reference, plain float32 torch), ``op``
(kdtree_verify.verify_attention: its CPU implementation on CPU tensors, the CUDA kernel on CUDA
tensors), ``triton`` (SGLang's ``extend_attention_fwd``; GPU, or CPU under TRITON_INTERPRET=1 in
float32) and ``validate`` (runs ``op`` and the baseline, serves the baseline's output and records
the largest absolute difference, like the SGLang backend's KDTREE_VERIFY=validate).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kdtree_verify import ForwardLayout

from ..sglang.comparison import LayerStats
from .config import ATTENTION_BACKENDS, baseline_backend


@dataclass(frozen=True, kw_only=True)
class ExtendMetadata(ForwardLayout):
    """SGLang's forward metadata for one extend/verify forward of B requests: the kernel's layout
    (``qo_indptr`` [B+1] int32 cumulative new-token counts, ``kv_indptr`` [B+1] int32 cumulative
    committed-prefix lengths, ``kv_indices`` the prefixes' pool slots (prefix only), a flat bool
    ``custom_mask`` of N x (prefix + N) per request or None for causal, ``mask_indptr`` [B+1]
    int64) and what the forward writes and sizes by."""

    out_cache_loc: torch.Tensor  # [T_total] int64: pool slots the new tokens' KV is written to
    max_extend_len: int  # host-side max N (SGLang keeps it on the host too)


# Signature every backend implements: (q, k_extend, v_extend, k_buffer, v_buffer, meta, sm_scale)
# -> out [T_total, H, 512] in q's dtype.
AttentionFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, ExtendMetadata, float],
    torch.Tensor,
]

# Observer: called with the exact keyword arguments each backend call receives (tests use it to
# check the layout the op sees; it must not modify them).
AttentionObserver = Callable[[dict], None]


class AttentionBackend:
    """One named backend plus optional observers of its calls.

    ``validate`` also keeps, per layer since the last :meth:`take_window`, the SGLang backend's
    comparison statistics (``sglang.comparison.LayerStats``: max |op - baseline|, the relative
    error, elements over ``tolerance`` = (atol, rtol) by torch.isclose's rule, NaN counting as
    over, and elements compared); the model sets ``layer`` before each layer's call."""

    def __init__(
        self,
        name: str,
        device: str,
        kv_splits: int = 1,
        tolerance: tuple[float, float] = (0.02, 0.02),
        checked: Callable[[AttentionFn], AttentionFn] | None = None,
    ) -> None:
        if name not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
        if kv_splits != 1 and name != "reference":
            raise ValueError(f"attention KV splits apply to the reference backend only, not {name}")
        self.name = name
        self.device = device
        self.observers: list[AttentionObserver] = []
        # validate mode's record: calls compared and the largest |op - baseline| seen so far.
        self.validate_calls = 0
        self.validate_max_abs_diff = 0.0
        self.layer = 0
        self.tolerance = tolerance
        self._window: dict[int, LayerStats] = {}
        if name == "validate":
            op = _load_backend("op", device)
            # ``checked`` wraps the side under test only (a test fault goes into the op, as in
            # the SGLang backend, where it goes into the kernel and never into Triton).
            self._fn = self._validating(
                checked(op) if checked else op, _load_backend(baseline_backend(device), device)
            )
        elif kv_splits > 1:
            from .split_kv import split_kv_reference

            self._fn = split_kv_reference(kv_splits)
        else:
            self._fn = _load_backend(name, device)

    def _validating(self, candidate: AttentionFn, baseline: AttentionFn) -> AttentionFn:
        def call(q, k_extend, v_extend, k_buffer, v_buffer, meta: ExtendMetadata, sm_scale: float):
            served = baseline(q, k_extend, v_extend, k_buffer, v_buffer, meta, sm_scale)
            checked = candidate(q, k_extend, v_extend, k_buffer, v_buffer, meta, sm_scale)
            stats = self._compare(checked.float(), served.float())
            self.validate_calls += 1
            self.validate_max_abs_diff = max(self.validate_max_abs_diff, stats.max_abs)
            self._window[self.layer] = _merged(self._window.get(self.layer), stats)
            return served

        return call

    def _compare(self, checked: torch.Tensor, served: torch.Tensor) -> LayerStats:
        if not served.numel():
            return LayerStats(self.layer, 0.0, 0.0, 0, 0)
        atol, rtol = self.tolerance
        diff = (checked - served).abs()
        over = ~torch.isclose(checked, served, atol=atol, rtol=rtol)  # NaN: over
        return LayerStats(
            layer_id=self.layer,
            max_abs=_nan_max(diff),
            max_rel=_nan_max(diff / (served.abs() + atol)),
            over_tolerance=int(over.sum()),
            compared=served.numel(),
        )

    def take_window(self) -> list[LayerStats]:
        """validate: each layer's comparison since the previous call (then starts afresh)."""
        window, self._window = self._window, {}
        return [window[layer] for layer in sorted(window)]

    def __call__(
        self,
        q: torch.Tensor,
        k_extend: torch.Tensor,
        v_extend: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        meta: ExtendMetadata,
        sm_scale: float,
    ) -> torch.Tensor:
        for observer in self.observers:
            observer(
                dict(
                    q=q,
                    k_extend=k_extend,
                    v_extend=v_extend,
                    k_buffer=k_buffer,
                    v_buffer=v_buffer,
                    qo_indptr=meta.qo_indptr,
                    kv_indptr=meta.kv_indptr,
                    kv_indices=meta.kv_indices,
                    custom_mask=meta.custom_mask,
                    mask_indptr=meta.mask_indptr,
                    out_cache_loc=meta.out_cache_loc,
                    sm_scale=sm_scale,
                )
            )
        return self._fn(q, k_extend, v_extend, k_buffer, v_buffer, meta, sm_scale)


def _nan_max(values: torch.Tensor) -> float:
    """The largest value, NaN if there is one (the worst a kernel can produce)."""
    return float("nan") if bool(values.isnan().any()) else float(values.max())


def _worst(a: float, b: float) -> float:
    """The larger of two errors, NaN winning."""
    return float("nan") if a != a or b != b else max(a, b)


def _merged(before: LayerStats | None, now: LayerStats) -> LayerStats:
    if before is None:
        return now

    return LayerStats(
        layer_id=now.layer_id,
        max_abs=_worst(before.max_abs, now.max_abs),
        max_rel=_worst(before.max_rel, now.max_rel),
        over_tolerance=before.over_tolerance + now.over_tolerance,
        compared=before.compared + now.compared,
    )


def _load_backend(name: str, device: str) -> AttentionFn:
    if name == "reference":
        from kdtree_verify import verify_attention_reference

        return _kdtree_call(verify_attention_reference)
    if name == "op":
        from kdtree_verify import verify_attention

        return _kdtree_call(verify_attention)
    return _load_triton(device)


def _kdtree_call(fn: Callable[..., torch.Tensor]) -> AttentionFn:
    def call(q, k_extend, v_extend, k_buffer, v_buffer, meta: ExtendMetadata, sm_scale: float):
        return fn(meta.kernel_metadata(sm_scale), q, k_extend, v_extend, k_buffer, v_buffer)

    return call


def _load_triton(device: str) -> AttentionFn:
    if not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "the triton backend needs a CUDA device; on CPU it runs only under the Triton "
            "interpreter: set TRITON_INTERPRET=1 before starting (float32 only, slow)"
        )
    from kdtree_verify.testing import sglang_extend_attention

    def call(q, k_extend, v_extend, k_buffer, v_buffer, meta: ExtendMetadata, sm_scale: float):
        # The arguments TritonAttnBackend.forward_extend passes for a target-verify forward.
        return sglang_extend_attention(
            meta.kernel_metadata(sm_scale),
            q,
            k_extend,
            v_extend,
            k_buffer,
            v_buffer,
            max_draft_tokens=meta.max_extend_len,
        )

    return call
