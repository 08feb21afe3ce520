"""CUDA implementation of ``kdtree::verify_attention`` (the kernel in kernel/csrc/).

``verify_attention_cuda`` is what the op's front door calls on CUDA. Without a plan in the
metadata it plans on every call (one tiny extra kernel) using a workspace cached per static shape
and stream; SGLang's backend makes one ``VerifyPlan`` per forward (``make_plan`` +
``VerifyPlan.update``) and builds it into the forward's ``VerifyMetadata``, which keeps every
layer's call free of allocation and host work under CUDA-graph capture.
"""

from __future__ import annotations

import torch

from ._build import load
from .dims import V_DIM
from .metadata import VerifyMetadata, check_contiguous
from .plan import VerifyPlan, make_plan
from .validation import FP8_KV_DTYPE, VerifyInputError

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)

_plan_cache: dict[tuple, VerifyPlan] = {}


def _cached_plan(q: torch.Tensor, batch_size: int) -> VerifyPlan:
    # Per stream as well: calls on one stream run in order, so they can share a workspace; calls
    # of the same shape on two streams may run at once, so they must not.
    stream = torch.cuda.current_stream(q.device).cuda_stream
    key = (q.device, stream, q.dtype, batch_size, q.shape[1], q.shape[0])
    plan = _plan_cache.get(key)
    if plan is None:
        plan = make_plan(batch_size, q.shape[1], q.shape[0], q.device, dtype=q.dtype)
        # A workspace allocated during CUDA-graph capture lives in that graph's private pool: use
        # it for this capture only, never hand it to later eager calls.
        if not torch.cuda.is_current_stream_capturing():
            _plan_cache[key] = plan
    return plan


def check_supported(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> None:
    """Refuse what the kernel does not implement, so callers can fall back (fp32, fp8 e5m2...)."""
    if q.dtype not in SUPPORTED_DTYPES:
        raise VerifyInputError(f"q: the CUDA kernel supports bfloat16 and float16, got {q.dtype}")
    if k_buffer.dtype not in (q.dtype, FP8_KV_DTYPE):
        raise VerifyInputError(
            f"k_buffer: dtype {k_buffer.dtype} is neither q's {q.dtype} nor float8_e4m3fn"
        )
    if k_buffer.dtype == FP8_KV_DTYPE and not (
        v_buffer.data_ptr() == k_buffer.data_ptr()
        and v_buffer.stride(0) == k_buffer.stride(0)
        and k_buffer.stride(0) % 8 == 0
        and k_buffer.data_ptr() % 8 == 0
    ):
        raise VerifyInputError(
            f"v_buffer: with an fp8 pool the CUDA kernel needs v_buffer to be the first {V_DIM} "
            "columns of k_buffer's rows (SGLang's MLA pool), rows 8-byte aligned"
        )


def check_outputs(q: torch.Tensor, outputs: dict[str, torch.Tensor]) -> None:
    """Refuse, by name and before any kernel runs, outputs the kernel would write on another
    device than q's (the extension would only stop with a RuntimeError)."""
    for name, t in outputs.items():
        if t.device != q.device:
            raise VerifyInputError(f"{name}: is on {t.device} but q is on {q.device}")


def verify_attention_cuda(
    metadata: VerifyMetadata,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp8_numerics: str = "fp16",
) -> None:
    """Write attention into ``out`` [T, H, 512] (q's dtype) and ``lse`` [T, H] (fp32, natural log).

    The front door (``verify_attention``) has validated the arguments. With ``metadata.plan``
    (checked when the metadata was built, ``update``d once per forward) the call does no
    allocation and no host work; without one it plans here. A float8_e4m3fn pool is dequantized
    on chip with ``k_scale``/``v_scale`` and rounded per ``fp8_numerics`` (``"fp16"`` or
    ``"triton"``; docs/kernel-fp8.md).
    """
    check_supported(q, k_buffer, v_buffer)
    batch_size = metadata.batch_size
    if q.shape[0] == 0:
        return
    check_outputs(q, {"out": out, "lse": lse})
    plan = metadata.plan
    if plan is None:
        check_contiguous(metadata.named_tensors())
        plan = _cached_plan(q, batch_size)
        plan.update(metadata.qo_indptr, metadata.kv_indptr, metadata.mask_indptr)
        plan.check_workspace()
    elif not plan.matches(batch_size, q.shape[1], q.shape[0]):
        raise VerifyInputError(
            f"plan: made for batch {plan.batch_size}, {plan.num_heads} heads, "
            f"{plan.total_tokens} tokens; called with {batch_size}, {q.shape[1]}, {q.shape[0]}"
        )
    ext = load()
    args = ext.AttendArgs()
    args.q, args.k_extend, args.v_extend = q, k_extend, v_extend
    args.k_buffer, args.v_buffer = k_buffer, v_buffer
    args.kv_indices = metadata.kv_indices
    mask = metadata.custom_mask
    args.custom_mask = mask.view(torch.uint8) if mask is not None else None
    args.out, args.lse = out, lse
    args.workspace, args.offsets = plan.workspace, plan.layout.offsets()
    args.batch = batch_size
    args.num_tile_slots, args.max_splits = plan.num_tile_slots, plan.max_splits
    args.sm_scale = metadata.sm_scale
    args.k_scale, args.v_scale = float(k_scale), float(v_scale)
    args.fp8_triton = fp8_numerics == "triton"
    ext.attend(args)
