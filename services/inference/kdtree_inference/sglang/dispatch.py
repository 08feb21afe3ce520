"""One layer's verify-attention call from a forward's marshaled inputs. Shared by the backend,
the GPU tests and the layer benchmark, so all three run exactly the call the server makes."""

from __future__ import annotations

import torch

from kdtree_verify import verify_attention

from .marshal import VerifyInputs


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

    The forward's metadata is validated once (by its first layer); on CUDA its ``VerifyPlan``
    (already ``update``d by the marshal) is shared by every layer, and this call checks the
    layer's tensors' shapes, allocates the output (from the graph pool under capture) and
    launches the kernel, with no host sync. On CPU the op runs its CPU implementation.
    """
    return verify_attention(
        inputs.kernel_metadata(sm_scale),
        q,
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        k_scale=k_scale,
        v_scale=v_scale,
        fp8_numerics=fp8_numerics,
    )
