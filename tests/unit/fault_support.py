"""A dense attention written out per request, to check the injected faults against: it takes the
prefix rows and the visibility of every query explicitly, so an expected result never goes
through the layout edits under test."""

from __future__ import annotations

import torch


def dense_attention(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    requests: list[tuple[int, int, list[int], torch.Tensor]],
    sm_scale: float,
) -> torch.Tensor:
    """``requests``: (first token, draft tokens n, pool slots of the prefix rows it attends to,
    visible [n, n] bool over its draft tokens). Output [T, H, 512] float32."""
    out = torch.zeros(q.shape[0], q.shape[1], v_buffer.shape[-1])
    for start, n, slots, visible in requests:
        idx = torch.tensor(slots, dtype=torch.long)
        keys = torch.cat([k_buffer[idx, 0].float(), k_extend[start : start + n, 0].float()])
        values = torch.cat([v_buffer[idx, 0].float(), v_extend[start : start + n, 0].float()])
        see = torch.cat([torch.ones(n, len(slots), dtype=torch.bool), visible.bool()], dim=1)
        scores = torch.einsum("thd,kd->thk", q[start : start + n].float(), keys) * sm_scale
        scores = scores.masked_fill(~see[:, None, :], float("-inf"))
        out[start : start + n] = torch.einsum("thk,kd->thd", scores.softmax(-1), values)
    return out


def first_hidden(visible: torch.Tensor, row: int) -> int | None:
    """The lowest draft node ``row`` does not see (what a tree_mask fault reveals to it)."""
    hidden = (~visible[row].bool()).nonzero()
    return int(hidden[0]) if hidden.numel() else None
