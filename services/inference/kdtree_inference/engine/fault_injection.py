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
from .attention import AttentionBackend, ExtendMetadata

log = logging.getLogger("kdtree_inference.engine")


class FaultyAttentionBackend(AttentionBackend):
    """An ``AttentionBackend`` whose every call carries ``fault``."""

    def __init__(self, name: str, device: str, fault: Fault, kv_splits: int = 1) -> None:
        super().__init__(name, device, kv_splits)
        self.fault = fault

    def __call__(
        self, q, k_extend, v_extend, k_buffer, v_buffer, meta: ExtendMetadata, sm_scale: float
    ) -> torch.Tensor:
        meta = apply_to_layout(self.fault, meta)
        return super().__call__(
            q, k_extend, v_extend, k_buffer, v_buffer, meta, scaled_softmax(self.fault, sm_scale)
        )


def attention_backend(
    name: str, device: str, fault: Fault | None, kv_splits: int = 1
) -> AttentionBackend:
    """The stock backend when ``fault`` is None or only touches weights, else the faulty one."""
    if fault is None or fault.kind == "weight":
        return AttentionBackend(name, device, kv_splits)
    return FaultyAttentionBackend(name, device, fault, kv_splits)


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
