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
    """One named backend plus optional observers of its calls."""

    def __init__(self, name: str, device: str, kv_splits: int = 1) -> None:
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
        if name == "validate":
            self._fn = self._validating(
                _load_backend("op", device), _load_backend(baseline_backend(device), device)
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
            diff = float((served.float() - checked.float()).abs().max()) if served.numel() else 0.0
            self.validate_calls += 1
            self.validate_max_abs_diff = max(self.validate_max_abs_diff, diff)
            return served

        return call

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
