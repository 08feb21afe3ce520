"""Split-KV attention: the reference attention computed in ``splits`` chunks of keys, merged by
their log-sum-exp (flash-decoding, what SGLang's ``--triton-attention-num-kv-splits`` does).

Mathematically it is the same attention as ``kdtree_verify.verify_attention_reference``; in
floating point its reduction order differs, so its outputs differ in the last bits. That makes
it the reference engine's equivalent-but-not-identical computation: a baseline served with
``--attention-kv-splits N`` is the parity gate's A/A' noise floor (docs/parity.md), not a fault.
"""

from __future__ import annotations

import torch

from kdtree_verify.reference import draft_visibility

from .attention import AttentionFn, ExtendMetadata


def split_kv_reference(splits: int) -> AttentionFn:
    """The reference attention with every request's keys split into ``splits`` chunks."""
    if splits < 1:
        raise ValueError(f"attention KV splits must be >= 1, got {splits}")

    def call(q, k_extend, v_extend, k_buffer, v_buffer, meta: ExtendMetadata, sm_scale: float):
        out = torch.empty(*q.shape[:2], v_buffer.shape[-1], dtype=torch.float32, device=q.device)
        qo, kv = meta.qo_indptr.tolist(), meta.kv_indptr.tolist()
        masked = meta.custom_mask is not None and meta.mask_indptr is not None
        mask_starts = meta.mask_indptr.tolist() if masked else [0] * len(qo)
        for b in range(len(qo) - 1):
            q_lo, q_hi = qo[b], qo[b + 1]
            n = q_hi - q_lo
            if n == 0:
                continue
            prefix = meta.kv_indices[kv[b] : kv[b + 1]].long()
            keys = torch.cat([k_buffer[prefix, 0].float(), k_extend[q_lo:q_hi, 0].float()])
            values = torch.cat([v_buffer[prefix, 0].float(), v_extend[q_lo:q_hi, 0].float()])
            visible = torch.ones(n, prefix.shape[0] + n, dtype=torch.bool)
            visible[:, prefix.shape[0] :] = draft_visibility(
                meta.custom_mask, mask_starts[b], n, prefix.shape[0]
            )
            out[q_lo:q_hi] = _merged(
                q[q_lo:q_hi].float(), keys, values, visible.to(q.device), sm_scale, splits
            )
        return out.to(q.dtype)

    return call


def _merged(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    sm_scale: float,
    splits: int,
) -> torch.Tensor:
    """softmax(q k^T) v with the keys reduced in chunks, each alone, then merged by max/LSE."""
    scores = torch.einsum("nhd,kd->nhk", queries, keys) * sm_scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    num = den = m_all = None
    for chunk, vals in zip(
        torch.tensor_split(scores, splits, dim=-1),
        torch.tensor_split(values, splits, dim=0),
        strict=True,
    ):
        if chunk.shape[-1] == 0:
            continue
        m = chunk.amax(dim=-1)  # [N, H]; -inf where the chunk is wholly masked for a row
        safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        weights = torch.exp(chunk - safe[..., None])
        part_sum, part = weights.sum(dim=-1), torch.einsum("nhk,kd->nhd", weights, vals)
        if m_all is None:
            num, den, m_all = part, part_sum, safe
            continue
        # Running merge (flash-decoding's reduce): rescale both sides to the larger maximum.
        new = torch.maximum(m_all, safe)
        old_scale, part_scale = torch.exp(m_all - new), torch.exp(safe - new)
        num = num * old_scale[..., None] + part * part_scale[..., None]
        den = den * old_scale + part_sum * part_scale
        m_all = new
    return num / den[..., None]
