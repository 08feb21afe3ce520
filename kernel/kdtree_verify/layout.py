"""Turn SGLang's target-verify metadata into the per-request quantities the kernel consumes.

Every helper here is made of tensor operations only and writes into a caller-provided buffer: no
``.item()``, no ``.tolist()``, no allocation of the result, so each can run once per forward inside
CUDA-graph capture and be replayed with new metadata (SGLang refreshes its metadata buffers in
``init_forward_metadata_out_graph``). Shapes are the static maxima of the capture; the valid part
is the first ``batch_size`` (+1 for indptr) entries.
"""

from __future__ import annotations

import torch


def _check_out(out: torch.Tensor, needed: int, name: str) -> None:
    if out.dim() != 1 or out.shape[0] < needed:
        raise ValueError(
            f"{name}: needs a 1-D buffer of at least {needed} entries, got {tuple(out.shape)}"
        )


def segment_lengths(indptr: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[b] = indptr[b + 1] - indptr[b] for the B segments of an indptr [B + 1]."""
    batch_size = indptr.shape[0] - 1
    _check_out(out, batch_size, "out")
    torch.sub(indptr[1:], indptr[:-1], out=out[:batch_size])
    return out[:batch_size]


def prefix_lengths(kv_indptr: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Committed prefix length per request (kv_indptr covers the prefix only on target verify)."""
    return segment_lengths(kv_indptr, out)


def draft_counts(qo_indptr: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Draft tokens per request (N; SGLang gives every request the same N on target verify)."""
    return segment_lengths(qo_indptr, out)


def mask_row_strides(
    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Row stride of each request's flat mask block: prefix_len + N (the prefix columns count)."""
    batch_size = qo_indptr.shape[0] - 1
    _check_out(out, batch_size, "out")
    view = out[:batch_size]
    torch.sub(kv_indptr[1:], kv_indptr[:-1], out=view)
    view.add_(qo_indptr[1:] - qo_indptr[:-1])
    return view


def mask_indptr_from_lengths(
    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """mask_indptr [B + 1] = cumsum(N x (prefix_len + N)), as SGLang builds it for target verify."""
    batch_size = qo_indptr.shape[0] - 1
    _check_out(out, batch_size + 1, "out")
    num_draft = qo_indptr[1:] - qo_indptr[:-1]
    row_stride = kv_indptr[1:] - kv_indptr[:-1] + num_draft
    out[:1].zero_()
    torch.cumsum(num_draft * row_stride, dim=0, out=out[1 : batch_size + 1])
    return out[: batch_size + 1]


def draft_slots(out_cache_loc: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The pool slots holding the draft tokens' KV (SGLang writes k/v there before attention).

    ``out_cache_loc`` is [T_total] in draft-token order, so request b's slots are
    ``out[qo_indptr[b]:qo_indptr[b + 1]]``; the copy puts them in a static buffer of the kernel's
    index dtype.
    """
    total = out_cache_loc.shape[0]
    _check_out(out, total, "out")
    out[:total].copy_(out_cache_loc)
    return out[:total]
