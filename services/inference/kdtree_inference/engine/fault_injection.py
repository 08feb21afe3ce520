"""The reference engine's side of ``KDTREE_INJECT_FAULT`` (TEST ONLY; see ``kdtree_inference.faults``).

Unset, the engine is built exactly as without this module: the stock ``AttentionBackend`` and the
weights as loaded. Set, ``weight`` perturbs the loaded weights once, and the other kinds edit
every attention call (the softmax scale, or the forward's KV/mask layout) before the backend runs.
"""

from __future__ import annotations

import logging

import torch

from ..faults import (
    Fault,
    apply_to_layout,
    banner,
    perturb_layer,
    scaled_softmax,
)
from .attention import AttentionBackend, AttentionFn, ExtendMetadata

log = logging.getLogger("kdtree_inference.engine")


def faulty(fn: AttentionFn, fault: Fault) -> AttentionFn:
    """``fn`` with ``fault`` in every call (its layout edit and softmax scale)."""

    def call(q, k_extend, v_extend, k_buffer, v_buffer, meta: ExtendMetadata, sm_scale: float):
        meta = apply_to_layout(fault, meta)
        return fn(q, k_extend, v_extend, k_buffer, v_buffer, meta, scaled_softmax(fault, sm_scale))

    return call


class FaultyAttentionBackend(AttentionBackend):
    """An ``AttentionBackend`` whose every call carries ``fault``; with ``validate``, only its
    op side does (as the SGLang backend puts a fault into the kernel, never into Triton), so the
    comparison sees the fault."""

    def __init__(
        self,
        name: str,
        device: str,
        fault: Fault,
        kv_splits: int = 1,
        tolerance: tuple[float, float] = (0.02, 0.02),
    ) -> None:
        validating = name == "validate"
        super().__init__(
            name,
            device,
            kv_splits,
            tolerance,
            checked=(lambda fn: faulty(fn, fault)) if validating else None,
        )
        self.fault = fault
        if not validating:
            self._fn = faulty(self._fn, fault)


def attention_backend(
    name: str,
    device: str,
    fault: Fault | None,
    kv_splits: int = 1,
    tolerance: tuple[float, float] = (0.02, 0.02),
) -> AttentionBackend:
    """The stock backend when ``fault`` is None or only touches weights, else the faulty one."""
    if fault is None or fault.kind == "weight":
        return AttentionBackend(name, device, kv_splits, tolerance)
    return FaultyAttentionBackend(name, device, fault, kv_splits, tolerance)


def faulty_weights(
    weights: dict[str, torch.Tensor], fault: Fault | None
) -> dict[str, torch.Tensor]:
    """``weights`` with a ``weight`` fault applied (the same dict otherwise)."""
    if fault is None or fault.kind != "weight":
        return weights
    return perturb_layer(weights, fault.layer, fault.size, fault.seed)


def log_fault(fault: Fault | None) -> None:
    if fault is not None:
        log.warning(banner(fault, "the reference engine"))
