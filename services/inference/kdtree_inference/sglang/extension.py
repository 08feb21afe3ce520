"""Is the kdtree CUDA kernel usable here? The launcher refuses to start without it, and the
backend refuses to serve ``validate``/``on`` without it.

The check is a real call: a one-request verify on the device, compared with the float32
reference. That catches every way the extension can be unusable (not built, missing symbol, built
for other GPU architectures: "no kernel image is available", wrong numerics) without depending on
how the kernel package reports its build.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A smoke call tiny enough to cost nothing and large enough to touch the prefix and the draft
# block: one request, 8 heads, 2 draft tokens, 3 prefix tokens.
_SMOKE_HEADS = 8
_SMOKE_DRAFT = 2
_SMOKE_PREFIX = 3
_SMOKE_TOLERANCE = 5e-2  # bf16 output of O(1) values


@dataclass(frozen=True)
class ExtensionStatus:
    usable: bool
    detail: str


def device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _smoke_args(device: torch.device) -> tuple:
    """``verify_attention``'s positional arguments: the metadata, then the layer's tensors."""
    from kdtree_verify import QK_DIM, V_DIM, VerifyMetadata

    generator = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    pool = _SMOKE_PREFIX + _SMOKE_DRAFT
    total = _SMOKE_DRAFT

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    k_buffer = rand(pool, 1, QK_DIM)
    q = rand(total, _SMOKE_HEADS, QK_DIM)
    k_extend = k_buffer[_SMOKE_PREFIX:].clone()
    v_extend = k_extend[..., :V_DIM]
    index = {"dtype": torch.int64, "device": device}
    metadata = VerifyMetadata.build(
        torch.tensor([0, total], **index),
        torch.tensor([0, _SMOKE_PREFIX], **index),
        torch.arange(_SMOKE_PREFIX, **index),
        None,
        None,
        QK_DIM**-0.5,
    )
    return metadata, q, k_extend, v_extend, k_buffer, k_buffer[..., :V_DIM]


def cuda_extension_status(device: torch.device | None = None) -> ExtensionStatus:
    """Run the kernel once on ``device`` (default: the current CUDA device) and say if it works."""
    if not torch.cuda.is_available():
        return ExtensionStatus(
            False, "no CUDA device is visible (torch.cuda.is_available() is False)"
        )
    device = device or torch.device("cuda", torch.cuda.current_device())
    arch = device_arch(device)
    try:
        from kdtree_verify import verify_attention, verify_attention_reference
    except ImportError as error:
        return ExtensionStatus(False, f"the kdtree_verify package does not import: {error}")
    args = _smoke_args(device)
    try:
        out = verify_attention(*args)
        torch.cuda.synchronize(device)
    except Exception as error:  # any failure means "not usable"; the message says which
        return ExtensionStatus(
            False,
            f"the kdtree CUDA kernel failed on this GPU ({arch}): {type(error).__name__}: "
            f"{error}. Build the extension for {arch}: make kernel with KDTREE_CUDA_ARCHS "
            "(docs/kernel.md, 'Correctness and build').",
        )
    expected = verify_attention_reference(*args)
    error = (out.float() - expected.float()).abs().max().item()
    if not error <= _SMOKE_TOLERANCE:
        return ExtensionStatus(
            False,
            f"the kdtree CUDA kernel runs on {arch} but its smoke result is off by {error:.3g} "
            f"(tolerance {_SMOKE_TOLERANCE}); refusing to serve it",
        )
    return ExtensionStatus(True, f"kdtree CUDA kernel usable on {arch}")


def kernel_status(device: torch.device) -> ExtensionStatus:
    """Usability of ``kdtree_verify.verify_attention`` for tensors on ``device``."""
    if device.type == "cpu":
        return ExtensionStatus(True, "CPU implementation of the verify op")
    if device.type == "cuda":
        return cuda_extension_status(device)
    return ExtensionStatus(False, f"the verify op has no implementation for {device.type!r}")
