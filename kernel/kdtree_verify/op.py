"""``kdtree::verify_attention``: the one front door, registered as a torch.library custom op.

Implementations:
- CPU: the kernel's algorithm written in torch (``split_kv_verify_cpu``), the executable
  specification of the kernel's numerics;
- CUDA: the compiled kernel (``kdtree_verify.cuda``);
- fake: shapes only, for torch.compile and meta tensors.
"""

from __future__ import annotations

import math

import torch

from .dims import V_DIM
from .metadata import VerifyMetadata
from .reference import draft_visibility
from .validation import FP8_KV_DTYPE, validate_layer

KV_TILE = 32
"""Tokens per KV tile of the kernel (kBlockN); with ``fp8_numerics="triton"`` the running max moves
once per tile, as Triton's moves once per block (32 tokens on sm_120)."""


def merge_partials(
    outs: list[torch.Tensor], lses: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge normalised partial attention states by log-sum-exp (FlashInfer's merge_state).

    Each partial is (o_i [.., D], lse_i [..]) with o_i normalised over its own keys. A partial
    that saw no keys has lse_i = -inf and contributes nothing; if every partial is empty the
    result is o = 0, lse = -inf.
    """
    lse_stack = torch.stack(lses)  # [P, ...]
    lse = torch.logsumexp(lse_stack, dim=0)
    finite = torch.isfinite(lse)
    weights = torch.where(finite, torch.exp(lse_stack - lse.where(finite, 0.0)), 0.0)
    out = (weights[..., None] * torch.stack(outs)).sum(dim=0)
    return out, lse


def _partial_attention(
    queries: torch.Tensor,  # [N, H, 576] float32
    keys: torch.Tensor,  # [K, 576] float32
    values: torch.Tensor,  # [K, 512] float32
    visible: torch.Tensor | None,  # [N, K] bool, None = all visible
    sm_scale: float,
    p_dtype: torch.dtype,
    key_scale: float = 1.0,
    value_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One split's normalised output and lse, with the kernel's rounding of P before P @ V.

    ``keys``/``values`` are the stored values (an fp8 pool's, exact in float32); the kernel scales
    the scores by ``key_scale`` and P by ``value_scale`` before rounding it, never the operands.
    """
    scores = torch.einsum("nhd,kd->nhk", queries, keys) * (sm_scale * key_scale)
    if visible is not None:
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = row_max.where(torch.isfinite(row_max), 0.0)
    p = torch.exp(scores - row_max)
    row_sum = p.sum(dim=-1)
    # The kernel feeds P (times the value scale) to the tensor cores in the input dtype; model that
    # rounding here.
    p = (p * value_scale).to(p_dtype).float()
    out = torch.einsum("nhk,kd->nhd", p, values) / row_sum.clamp_min(1e-30)[..., None]
    lse = torch.log(row_sum) + row_max[..., 0]
    return out, lse


def _fp16_operand(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the fp8 kernel's fp16 MMA operand: round to nearest, saturating at 65504."""
    finfo = torch.finfo(torch.float16)
    return x.float().clamp(finfo.min, finfo.max).to(torch.float16).float()


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to float8_e4m3fn and back to float32 as SGLang's Triton fp8 path rounds its
    MMA operands (``cvt.rn.satfinite``: to nearest even, magnitudes at or above 448 to +-448, NaN
    kept)."""
    x = x.float()
    return x.clamp(-448.0, 448.0).to(FP8_KV_DTYPE).float().where(~torch.isnan(x), x)


def _triton_fp8_attention(
    queries: torch.Tensor,  # [N, H, 576] float32: the MMA operand of q
    prefix_keys: torch.Tensor,  # [L, 576] float32: the stored values
    prefix_values: torch.Tensor,  # [L, 512]
    draft_keys: torch.Tensor,  # [N, 576] float32: the MMA operands of the draft rows
    draft_values: torch.Tensor,  # [N, 512]
    draft_visible: torch.Tensor,  # [N, N] bool
    sm_scale: float,
    draft_p_dtype: torch.dtype,
    k_scale: float,
    v_scale: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel with ``fp8_numerics="triton"``: prefix scores from q rounded to e4m3, draft scores
    from q itself (Triton's two stages). The virtual sequence is cut into splits of ``chunk_size``
    tokens (rounded up to whole 32-token tiles); each split starts from the running max of every
    earlier split (the kernel's row-max pass), moves it on every tile, rounds P for P V (prefix:
    e4m3, then times v_scale; draft: to ``draft_p_dtype``) and sums P unrounded; the splits merge
    by log-sum-exp. So the result is that of one sequential pass, whatever the split size."""
    prefix_len = prefix_keys.shape[0]
    keys = torch.cat([prefix_keys, draft_keys])
    values = torch.cat([prefix_values, draft_values])
    draft_scores = torch.einsum("nhd,kd->nhk", queries, draft_keys) * sm_scale
    scores = torch.cat(
        [
            torch.einsum("nhd,kd->nhk", round_e4m3(queries), prefix_keys) * (sm_scale * k_scale),
            draft_scores.masked_fill(~draft_visible[:, None, :], float("-inf")),
        ],
        dim=-1,
    )
    shape = queries.shape[:2]
    chunk = -(-max(chunk_size, 1) // KV_TILE) * KV_TILE
    outs, lses = [], []
    for begin in range(0, keys.shape[0], chunk):
        earlier = scores[..., :begin]
        m = earlier.amax(dim=-1) if begin else torch.full(shape, float("-inf"))
        row_sum = torch.zeros(shape)
        acc = torch.zeros(*shape, values.shape[-1])
        for start in range(begin, min(begin + chunk, keys.shape[0]), KV_TILE):
            s = scores[..., start : start + KV_TILE]
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_use = m_new.where(torch.isfinite(m_new), 0.0)
            alpha = torch.exp(m - m_use).where(torch.isfinite(m), 0.0)
            p = torch.exp(s - m_use[..., None])
            row_sum = row_sum * alpha + p.sum(dim=-1)
            cols = torch.arange(start, start + s.shape[-1])
            operand = torch.where(
                cols < prefix_len, round_e4m3(p) * v_scale, p.to(draft_p_dtype).float()
            )
            acc = acc * alpha[..., None] + torch.einsum("nhk,kd->nhd", operand, values[cols])
            m = m_new
        outs.append(acc / row_sum.clamp_min(1e-30)[..., None])
        lses.append(torch.log(row_sum) + m.where(torch.isfinite(m), 0.0))
    return merge_partials(outs, lses)


def split_kv_verify_cpu(
    metadata: VerifyMetadata,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp8_numerics: str = "fp16",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's algorithm: prefix in chunks of ``metadata.chunk_size``, draft block as one
    more partial, LSE merge.

    An fp8 pool's prefix partials take ``k_scale`` on the scores and ``v_scale`` on P (the
    kernel's placement of SGLang's descales); the draft partial is unscaled. With an fp8 pool the
    kernel's MMAs run in fp16: bf16 q, the draft rows and P are rounded to fp16 (saturating).
    Float32 q (the CPU op only) keeps float32 throughout. ``fp8_numerics="triton"`` (fp8 pool
    only) rounds as SGLang's Triton fp8 path does (``_triton_fp8_attention``).
    """
    sm_scale, chunk_size = metadata.sm_scale, metadata.chunk_size
    custom_mask = metadata.custom_mask
    fp8_pool = k_buffer.dtype == FP8_KV_DTYPE
    triton_rounding = fp8_pool and fp8_numerics == "triton"
    fp16_mma = fp8_pool and q.dtype != torch.float32
    operand = _fp16_operand if fp16_mma else torch.Tensor.float
    p_dtype = torch.float16 if fp16_mma else q.dtype
    total_tokens, num_heads, _ = q.shape
    out = torch.zeros(total_tokens, num_heads, v_buffer.shape[-1], dtype=torch.float32)
    lse = torch.full((total_tokens, num_heads), float("-inf"), dtype=torch.float32)
    qo, kv = metadata.qo_indptr.tolist(), metadata.kv_indptr.tolist()
    mask_starts = metadata.mask_indptr.tolist() if custom_mask is not None else [0] * len(qo)
    for b in range(len(qo) - 1):
        q_lo, q_hi = qo[b], qo[b + 1]
        num_draft = q_hi - q_lo
        if num_draft == 0:
            continue
        queries = operand(q[q_lo:q_hi])
        prefix = metadata.kv_indices[kv[b] : kv[b + 1]].long()
        visible = draft_visibility(custom_mask, mask_starts[b], num_draft, prefix.shape[0])
        draft_keys, draft_values = operand(k_extend[q_lo:q_hi, 0]), operand(v_extend[q_lo:q_hi, 0])
        if triton_rounding:
            out[q_lo:q_hi], lse[q_lo:q_hi] = _triton_fp8_attention(
                queries,
                k_buffer[prefix, 0].float(),
                v_buffer[prefix, 0].float(),
                draft_keys,
                draft_values,
                visible,
                sm_scale,
                q.dtype,
                k_scale,
                v_scale,
                chunk_size,
            )
            continue
        partial_outs, partial_lses = [], []
        for start in range(0, prefix.shape[0], chunk_size):
            rows = prefix[start : start + chunk_size]
            o_i, lse_i = _partial_attention(
                queries,
                k_buffer[rows, 0].float(),
                v_buffer[rows, 0].float(),
                None,
                sm_scale,
                p_dtype,
                k_scale,
                v_scale,
            )
            partial_outs.append(o_i)
            partial_lses.append(lse_i)
        o_i, lse_i = _partial_attention(
            queries, draft_keys, draft_values, visible, sm_scale, p_dtype
        )
        partial_outs.append(o_i)
        partial_lses.append(lse_i)
        out[q_lo:q_hi], lse[q_lo:q_hi] = merge_partials(partial_outs, partial_lses)
    return out.to(q.dtype), lse


@torch.library.custom_op("kdtree::verify_attention", mutates_args=())
def _verify_attention_op(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    sm_scale: float,
    chunk_size: int,
    k_scale: float,
    v_scale: float,
    fp8_numerics: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError(
        f"kdtree::verify_attention has no implementation for device {q.device.type!r} "
        "(supported: cpu, cuda)"
    )


def _from_op_args(args: tuple) -> tuple[VerifyMetadata, tuple, dict]:
    """The op's flat arguments (its schema above, validated by the front door) as the metadata,
    the layer's tensors and the pool's numerics."""
    (
        q,
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        mask_indptr,
        sm_scale,
        chunk_size,
        k_scale,
        v_scale,
        fp8_numerics,
    ) = args
    metadata = VerifyMetadata(
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        mask_indptr if custom_mask is not None else None,
        sm_scale,
        chunk_size=chunk_size,
    )
    numerics = {"k_scale": k_scale, "v_scale": v_scale, "fp8_numerics": fp8_numerics}
    return metadata, (q, k_extend, v_extend, k_buffer, v_buffer), numerics


def op_arguments(
    metadata: VerifyMetadata,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp8_numerics: str = "fp16",
) -> tuple:
    """The flat arguments of ``kdtree::verify_attention`` (its schema's order) for a call of
    ``verify_attention``: the inverse of ``_from_op_args``."""
    return (
        q,
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        metadata.qo_indptr,
        metadata.kv_indptr,
        metadata.kv_indices,
        metadata.custom_mask,
        metadata.mask_indptr,
        metadata.sm_scale,
        metadata.chunk_size,
        float(k_scale),
        float(v_scale),
        fp8_numerics,
    )


@_verify_attention_op.register_kernel("cpu")
def _verify_attention_cpu(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
    # The CPU implementation is the specification itself.
    metadata, layer, numerics = _from_op_args(args)
    return split_kv_verify_cpu(metadata, *layer, **numerics)


def _empty_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = q.new_empty(*q.shape[:2], V_DIM)
    lse = q.new_empty(q.shape[:2], dtype=torch.float32)
    return out, lse


def _run_cuda(
    metadata: VerifyMetadata, layer: tuple, numerics: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    from . import cuda as cuda_impl

    run = getattr(cuda_impl, "verify_attention_cuda", None)
    if run is None:
        raise RuntimeError(
            "kdtree_verify: the CUDA kernel is not available in this build "
            "(kdtree_verify.cuda.verify_attention_cuda is missing); build it with `make kernel`"
        )
    out, lse = _empty_outputs(layer[0])
    run(metadata, *layer, out, lse, **numerics)
    return out, lse


@_verify_attention_op.register_kernel("cuda")
def _verify_attention_cuda(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_cuda(*_from_op_args(args))  # the kernel plans its own splits


@_verify_attention_op.register_fake
def _verify_attention_fake(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
    return _empty_outputs(args[0])


def verify_attention(
    metadata: VerifyMetadata,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    return_lse: bool = False,
    check_values: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp8_numerics: str = "fp16",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """MLA tree-verify attention of one layer in SGLang's target-verify layout (docs/kernel.md,
    "The interface"), for a forward's ``metadata`` (``VerifyMetadata.build``).

    Returns out [T_total, H, 512] in q's dtype, and with ``return_lse`` the natural-log LSE
    [T_total, H] float32. ``check_values`` adds the validation that reads tensor contents (a host
    sync on GPU; never use it under CUDA-graph capture). A float8_e4m3fn pool is dequantized with
    ``k_scale``/``v_scale`` and rounded per ``fp8_numerics`` (docs/kernel-fp8.md states both
    modes' numerics). With ``metadata.plan`` the CUDA kernel runs on that plan (no allocation
    beyond the outputs, no host work); otherwise the call goes through ``kdtree::verify_attention``.
    """
    validate_layer(
        metadata,
        q,
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        check_values=check_values,
        k_scale=k_scale,
        v_scale=v_scale,
        fp8_numerics=fp8_numerics,
    )
    layer = (q, k_extend, v_extend, k_buffer, v_buffer)
    numerics = {"k_scale": k_scale, "v_scale": v_scale, "fp8_numerics": fp8_numerics}
    if metadata.plan is not None:
        out, lse = _run_cuda(metadata, layer, numerics)
    else:
        out, lse = torch.ops.kdtree.verify_attention(*op_arguments(metadata, *layer, **numerics))
    return (out, lse) if return_lse else out


def deepseek_v3_sm_scale(rope_scaling_factor: float = 40.0, mscale_all_dim: float = 1.0) -> float:
    """DeepSeek-V3's softmax scale: 192^-0.5 x mscale^2 (0.135234 for the released config)."""
    mscale = 0.1 * mscale_all_dim * math.log(rope_scaling_factor) + 1.0
    return 192**-0.5 * mscale * mscale
