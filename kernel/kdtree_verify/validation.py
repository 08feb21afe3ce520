"""Input validation for the verify op.

Every check here is on shapes, dtypes, devices and strides (metadata the host already has), so it
costs no host-device synchronisation and can run inside CUDA-graph capture. Checks that must read
tensor *values* (indptr monotonicity, mask length against mask_indptr, kv_indices bounds) sync the
host; they run only when asked (``check_values=True``) or on CPU tensors, where they are free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .dims import QK_DIM, ROPE_DIM, V_DIM

if TYPE_CHECKING:
    from .metadata import VerifyMetadata

INDEX_DTYPES = (torch.int32, torch.int64)
MASK_DTYPES = (torch.bool, torch.uint8)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_KV_DTYPE = torch.float8_e4m3fn
"""The quantized KV pool dtype (SGLang's ``--kv-cache-dtype fp8_e4m3``); scales are per layer."""
FP8_MAX_V_SCALE = 255.0
"""An fp8 pool's P V MMAs run in fp16: P (< 2^8 in the kernel) x v_scale must stay below 65504."""
FP8_NUMERICS = ("fp16", "triton")
"""How an fp8 pool's kernel rounds (docs/kernel-fp8.md): ``fp16`` keeps q and P in fp16 (the
closest to a float32 computation on the stored values); ``triton`` rounds them as SGLang's Triton
fp8 path does (q and the prefix's P to e4m3, the draft's P to q's dtype), for parity with stock."""


class VerifyInputError(ValueError):
    """An argument of the verify op is malformed; the message names it and says why."""


@dataclass(frozen=True)
class VerifyShape:
    """Static facts about a validated call (read from shapes only, never from tensor values)."""

    batch_size: int
    total_tokens: int
    num_heads: int
    pool_size: int


def _fail(argument: str, why: str) -> None:
    raise VerifyInputError(f"{argument}: {why}")


def _check_rank(t: torch.Tensor, name: str, rank: int, layout: str) -> None:
    if t.dim() != rank:
        _fail(name, f"expected {rank} dims {layout}, got shape {tuple(t.shape)}")


def _check_last_dim_contiguous(t: torch.Tensor, name: str) -> None:
    if t.stride(-1) != 1:
        _fail(name, f"the last dimension must be contiguous (stride 1), got strides {t.stride()}")


def validate_metadata(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    sm_scale: float,
    chunk_size: int,
) -> None:
    """Raise :class:`VerifyInputError` naming the first malformed per-forward argument.

    Shapes and dtypes only (no host sync). Devices are checked against q by
    :func:`validate_layer`, and the checks that read values need q and the pool too.
    """
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        _check_rank(t, name, 1, "[B + 1]")
        if t.dtype not in INDEX_DTYPES:
            _fail(name, f"dtype must be int32 or int64, got {t.dtype}")
    batch_size = qo_indptr.shape[0] - 1
    if batch_size < 1:
        _fail("qo_indptr", "needs at least 2 entries (one request)")
    if kv_indptr.shape[0] != batch_size + 1:
        _fail("kv_indptr", f"has {kv_indptr.shape[0]} entries, qo_indptr has {batch_size + 1}")
    _check_rank(kv_indices, "kv_indices", 1, "[total prefix tokens]")
    if kv_indices.dtype not in INDEX_DTYPES:
        _fail("kv_indices", f"dtype must be int32 or int64, got {kv_indices.dtype}")

    if custom_mask is not None:
        _check_rank(custom_mask, "custom_mask", 1, "(flat, per request N x (prefix + N))")
        if custom_mask.dtype not in MASK_DTYPES:
            _fail("custom_mask", f"dtype must be bool or uint8, got {custom_mask.dtype}")
        if mask_indptr is None:
            _fail("mask_indptr", "is required when custom_mask is given")
        _check_rank(mask_indptr, "mask_indptr", 1, "[B + 1]")
        if mask_indptr.dtype not in INDEX_DTYPES:
            _fail("mask_indptr", f"dtype must be int32 or int64, got {mask_indptr.dtype}")
        if mask_indptr.shape[0] != batch_size + 1:
            _fail("mask_indptr", f"has {mask_indptr.shape[0]} entries, expected {batch_size + 1}")

    validate_sm_scale(sm_scale)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")


def validate_sm_scale(sm_scale: float) -> None:
    """The softmax scale is a positive number."""
    if not (isinstance(sm_scale, float | int) and sm_scale > 0):
        _fail("sm_scale", f"must be a positive number, got {sm_scale!r}")


def validate_layer(
    metadata: VerifyMetadata,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    check_values: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp8_numerics: str = "fp16",
) -> VerifyShape:
    """Raise :class:`VerifyInputError` naming the first malformed per-layer argument.

    ``k_buffer``/``v_buffer`` are in q's dtype, or both float8_e4m3fn with the per-layer
    ``k_scale``/``v_scale`` (positive; 1.0 for any other pool). ``k_extend``/``v_extend`` are
    always in q's dtype. ``metadata`` (validated when it was built) must be on q's device.

    ``check_values`` adds the checks that read tensor contents (a host sync on GPU tensors):
    indptr arrays start at 0 and never decrease, qo/kv/mask extents match the tensors they index,
    and every kv index lies inside the pool. On CPU tensors these checks always run.
    """
    total_tokens, num_heads = _check_q(q)
    device = q.device
    _check_kv_shapes(total_tokens, k_extend, v_extend, k_buffer, v_buffer)
    fp8_pool = _check_kv_dtypes_and_devices(q, k_extend, v_extend, k_buffer, v_buffer)
    for name, t in metadata.named_tensors():
        if t.device != device:
            _fail(name, f"is on {t.device} but q is on {device}")
    _check_scales(k_scale, v_scale, fp8_numerics, fp8_pool)

    if check_values or device.type == "cpu":
        _check_values(metadata, total_tokens, k_buffer.shape[0])
    return VerifyShape(metadata.batch_size, total_tokens, num_heads, k_buffer.shape[0])


def _check_q(q: torch.Tensor) -> tuple[int, int]:
    """q is [T_total, H, 576], float, contiguous in its last dim; returns (T_total, H)."""
    _check_rank(q, "q", 3, f"[T_total, H, {QK_DIM}]")
    total_tokens, num_heads, qk_dim = q.shape
    if qk_dim != QK_DIM:
        _fail("q", f"last dim must be {QK_DIM} ({V_DIM} latent + {ROPE_DIM} rope), got {qk_dim}")
    if num_heads < 1:
        _fail("q", "needs at least one head")
    if q.dtype not in FLOAT_DTYPES:
        _fail("q", f"dtype must be one of float32/bfloat16/float16, got {q.dtype}")
    _check_last_dim_contiguous(q, "q")
    return total_tokens, num_heads


def _check_kv_shapes(
    total_tokens: int,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
) -> None:
    """The draft KV has q's tokens; the pool one latent KV head, K and V of one size."""
    for name, t, dim in (
        ("k_extend", k_extend, QK_DIM),
        ("v_extend", v_extend, V_DIM),
    ):
        _check_rank(t, name, 3, f"[T_total, 1, {dim}]")
        if t.shape != (total_tokens, 1, dim):
            _fail(name, f"expected shape {(total_tokens, 1, dim)} to match q, got {tuple(t.shape)}")
    for name, t, dim in (
        ("k_buffer", k_buffer, QK_DIM),
        ("v_buffer", v_buffer, V_DIM),
    ):
        _check_rank(t, name, 3, f"[pool, 1, {dim}]")
        if t.shape[1:] != (1, dim):
            _fail(
                name, f"expected shape [pool, 1, {dim}] (one latent KV head), got {tuple(t.shape)}"
            )
    if v_buffer.shape[0] != k_buffer.shape[0]:
        _fail(
            "v_buffer", f"pool size {v_buffer.shape[0]} differs from k_buffer's {k_buffer.shape[0]}"
        )


def _check_kv_dtypes_and_devices(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
) -> bool:
    """Dtypes (the draft KV in q's, the pool in q's or fp8), q's device; whether the pool is fp8."""
    fp8_pool = k_buffer.dtype == FP8_KV_DTYPE
    pool_dtype = FP8_KV_DTYPE if fp8_pool else q.dtype
    for name, t, dtype in (
        ("k_extend", k_extend, q.dtype),
        ("v_extend", v_extend, q.dtype),
        ("k_buffer", k_buffer, pool_dtype),
        ("v_buffer", v_buffer, pool_dtype),
    ):
        if t.dtype != dtype:
            _fail(
                name,
                f"dtype {t.dtype} differs from {dtype} (the pool is in q's dtype {q.dtype} or "
                "float8_e4m3fn; the draft KV always in q's dtype)",
            )
        if t.device != q.device:
            _fail(name, f"is on {t.device} but q is on {q.device}")
        _check_last_dim_contiguous(t, name)
    return fp8_pool


def _check_scales(k_scale: float, v_scale: float, fp8_numerics: str, fp8_pool: bool) -> None:
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not (isinstance(value, float | int) and 0 < value < float("inf")):
            _fail(name, f"must be a positive finite number, got {value!r}")
        if not fp8_pool and value != 1.0:
            _fail(name, f"is {value!r}, but only a float8_e4m3fn pool is scaled (use 1.0)")
    if fp8_numerics not in FP8_NUMERICS:
        _fail("fp8_numerics", f"must be one of {', '.join(FP8_NUMERICS)}, got {fp8_numerics!r}")
    if fp8_pool and v_scale > FP8_MAX_V_SCALE:
        _fail("v_scale", f"must be <= {FP8_MAX_V_SCALE} with an fp8 pool (P x v_scale is fp16)")


def _check_indptr(
    name: str, indptr: torch.Tensor, end: int, end_what: str, *, may_end_early: bool = False
) -> list[int]:
    """Starts at 0, never decreases, ends at ``end`` (or at most ``end`` with ``may_end_early``)."""
    values = indptr.tolist()
    if values[0] != 0:
        _fail(name, f"must start at 0, got {values[0]}")
    for i in range(len(values) - 1):
        if values[i + 1] < values[i]:
            _fail(
                name,
                f"must be non-decreasing, but entry {i + 1} ({values[i + 1]}) < entry {i} ({values[i]})",
            )
    too_far = values[-1] > end if may_end_early else values[-1] != end
    if too_far:
        _fail(name, f"last entry is {values[-1]} but {end_what} is {end}")
    return values


def _check_values(metadata: VerifyMetadata, total_tokens: int, pool_size: int) -> None:
    qo_indptr, kv_indptr, kv_indices = metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices
    custom_mask, mask_indptr = metadata.custom_mask, metadata.mask_indptr
    qo = _check_indptr("qo_indptr", qo_indptr, total_tokens, "q's token count")
    # SGLang's kv_indices is a buffer that may run past the batch's last entry.
    kv = _check_indptr(
        "kv_indptr", kv_indptr, kv_indices.shape[0], "len(kv_indices)", may_end_early=True
    )
    used = kv_indices[: kv[-1]]
    if used.numel():
        lo, hi = int(used.min()), int(used.max())
        if lo < 0 or hi >= pool_size:
            _fail("kv_indices", f"values must lie in [0, {pool_size}), found range [{lo}, {hi}]")
    if custom_mask is None:
        return
    assert mask_indptr is not None
    expected = [0]
    for b in range(len(qo) - 1):
        n, prefix = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        expected.append(expected[-1] + n * (prefix + n))
    actual = mask_indptr.tolist()
    if actual != expected:
        first = next(i for i, (a, e) in enumerate(zip(actual, expected, strict=True)) if a != e)
        _fail(
            "mask_indptr",
            f"entry {first} is {actual[first]}, expected {expected[first]} "
            "(cumsum of N x (prefix_len + N) per request)",
        )
    if custom_mask.shape[0] < expected[-1]:
        _fail(
            "custom_mask",
            f"has {custom_mask.shape[0]} elements but mask_indptr needs {expected[-1]}",
        )
