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
    """softmax(q k^T) v over the key chunks, each reduced alone, then merged by max/LSE."""
    maxima, sums, partials = [], [], []
    for chunk in torch.tensor_split(torch.arange(keys.shape[0]), splits):
        if chunk.numel() == 0:
            continue
        scores = torch.einsum("nhd,kd->nhk", queries, keys[chunk]) * sm_scale
        scores = scores.masked_fill(~visible[:, None, chunk], float("-inf"))
        m = scores.amax(dim=-1)  # [N, H]; -inf where the chunk is wholly masked for a row
        safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        weights = torch.exp(scores - safe[..., None])
        maxima.append(m)
        sums.append(weights.sum(dim=-1))
        partials.append(torch.einsum("nhk,kd->nhd", weights, values[chunk]))
    m_all = torch.stack(maxima).amax(dim=0)
    num = torch.zeros_like(partials[0])
    den = torch.zeros_like(sums[0])
    for m, s, o in zip(maxima, sums, partials, strict=True):
        scale = torch.where(torch.isfinite(m), torch.exp(m - m_all), torch.zeros_like(m))
        num += scale[..., None] * o
        den += scale * s
    return num / den[..., None]
