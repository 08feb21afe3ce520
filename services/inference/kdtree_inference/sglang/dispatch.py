"""One verify-attention call from marshaled inputs: the CPU op on CPU, the planned CUDA kernel
on CUDA. Shared by the backend, the GPU tests and the layer benchmark, so all three run exactly
the call the server makes."""

from __future__ import annotations

import torch

from kdtree_verify import validate_verify_inputs, verify_attention

from .marshal import VerifyInputs

QK_DIM = 576
V_DIM = 512


def verify_with_inputs(
    inputs: VerifyInputs,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    sm_scale: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp8_numerics: str = "fp16",
) -> torch.Tensor:
    """Attention output [T_total, H, 512] in q's dtype for one layer of a verify forward
    (``k_scale``/``v_scale``: an fp8 pool's dequantization scales; ``fp8_numerics``: how an fp8
    pool's kernel rounds, ``"fp16"`` or ``"triton"``).

    On CUDA the forward's ``VerifyPlan`` (already ``update``d by the marshal) is shared by every
    layer: this call does shape checks, allocates the output (from the graph pool under capture)
    and launches the kernel, with no host sync.
    """
    args = (
        q, k_extend, v_extend, k_buffer, v_buffer, inputs.qo_indptr, inputs.kv_indptr,
        inputs.kv_indices, inputs.custom_mask, inputs.mask_indptr, sm_scale,
    )  # fmt: skip
    scales = {"k_scale": k_scale, "v_scale": v_scale, "fp8_numerics": fp8_numerics}
    if inputs.plan is None:  # CPU: the op's front door runs the CPU implementation
        return verify_attention(*args, **scales)
    from kdtree_verify.cuda import verify_attention_cuda

    validate_verify_inputs(*args, **scales)  # shapes and dtypes only on CUDA: graph-safe
    out = q.new_empty(q.shape[0], q.shape[1], V_DIM)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    verify_attention_cuda(
        *args, causal=inputs.custom_mask is None, out=out, lse=lse, plan=inputs.plan, **scales
    )
    return out
