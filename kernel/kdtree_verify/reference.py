"""The plain float32 computation of MLA tree-verify attention, in SGLang's target-verify layout.

This is the definition every other implementation is measured against: one request at a time,
dense scores over [prefix | draft] keys, the tree mask applied to the draft columns, softmax, and
the weighted sum of values. It favours obviousness over speed.

An fp8 (float8_e4m3fn) pool holds K / k_scale; the prefix keys and values are its dequantized
values, float(k8) x k_scale and float(v8) x v_scale (SGLang's k_descale / v_descale), and the draft
tokens' KV (``k_extend``/``v_extend``, in q's dtype) is used as is.
"""

from __future__ import annotations

import torch

from .metadata import VerifyMetadata
from .validation import validate_layer


def draft_visibility(
    custom_mask: torch.Tensor | None,
    mask_start: int,
    num_draft: int,
    prefix_len: int,
) -> torch.Tensor:
    """[N, N] bool: which draft tokens each draft token sees.

    With a mask, rows are read from the flat per-request block of N x (prefix_len + N) entries at
    ``mask_start``; the prefix columns are skipped (SGLang's kernel treats them as visible and never
    reads them). Without a mask the draft block is causal.
    """
    if custom_mask is None:
        return torch.ones(num_draft, num_draft, dtype=torch.bool, device="cpu").tril()
    row_stride = prefix_len + num_draft
    block = custom_mask[mask_start : mask_start + num_draft * row_stride].to("cpu")
    return block.view(num_draft, row_stride)[:, prefix_len:] != 0


def verify_attention_reference(
    metadata: VerifyMetadata,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    return_lse: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of every draft token over its request's prefix and visible draft tokens.

    Returns ``out`` [T_total, H, 512] in q's dtype, and with ``return_lse`` also the natural-log
    log-sum-exp of the scaled scores, [T_total, H] float32. Computed in float32 on q's device.
    """
    validate_layer(
        metadata,
        q,
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        check_values=True,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    custom_mask, sm_scale = metadata.custom_mask, metadata.sm_scale
    total_tokens, num_heads, _ = q.shape
    v_dim = v_buffer.shape[-1]
    out = torch.empty(total_tokens, num_heads, v_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(total_tokens, num_heads, dtype=torch.float32, device=q.device)
    qo, kv = metadata.qo_indptr.tolist(), metadata.kv_indptr.tolist()
    mask_starts = metadata.mask_indptr.tolist() if custom_mask is not None else [0] * len(qo)

    for b in range(len(qo) - 1):
        q_lo, q_hi = qo[b], qo[b + 1]
        num_draft = q_hi - q_lo
        if num_draft == 0:
            continue
        prefix = metadata.kv_indices[kv[b] : kv[b + 1]].long()
        prefix_len = prefix.shape[0]
        keys = torch.cat([k_buffer[prefix, 0].float() * k_scale, k_extend[q_lo:q_hi, 0].float()])
        values = torch.cat([v_buffer[prefix, 0].float() * v_scale, v_extend[q_lo:q_hi, 0].float()])
        queries = q[q_lo:q_hi].float()  # [N, H, 576]

        scores = torch.einsum("nhd,kd->nhk", queries, keys) * sm_scale  # [N, H, prefix + N]
        visible = torch.ones(num_draft, prefix_len + num_draft, dtype=torch.bool)
        visible[:, prefix_len:] = draft_visibility(
            custom_mask, mask_starts[b], num_draft, prefix_len
        )
        scores = scores.masked_fill(~visible.to(q.device)[:, None, :], float("-inf"))

        row_lse = torch.logsumexp(scores, dim=-1)  # [N, H]
        weights = torch.exp(scores - row_lse[..., None])
        out[q_lo:q_hi] = torch.einsum("nhk,kd->nhd", weights, values)
        lse[q_lo:q_hi] = row_lse

    out = out.to(q.dtype)
    return (out, lse) if return_lse else out
