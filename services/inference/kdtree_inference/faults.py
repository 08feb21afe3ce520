"""Graded faults for measuring the parity gate's resolution: the spec and the tensor edits.

TEST ONLY, never enabled by default. One environment variable, ``KDTREE_INJECT_FAULT``, selects
one fault; the reference engine (``engine/fault_injection.py``) and the SGLang backend
(``sglang/fault_injection.py``) read it at start, log it as a warning and apply it:

=================== ============================================================================
value               fault
=================== ============================================================================
``weight:L:S[:N]``  every matrix of layer L gets seeded Gaussian noise of relative size S
                    (``||dW|| = S * ||W||``, seed N, default 0); reference engine only (SGLang:
                    ``bench/kdtree_bench/models/make_model.py --perturb L:S`` writes a perturbed copy)
``scale:S``         the attention softmax scale is multiplied by (1 + S) in every layer
``kv_drop:P``       the KV row at position P is masked out for every query after it
``tree_mask:R``     draft token R (row R of the tree mask, 0 = the root) also sees the first
                    draft node it should not see
=================== ============================================================================

The edits work on SGLang's target-verify layout (``qo_indptr``, ``kv_indptr``, ``kv_indices``,
a flat ``custom_mask`` of N x (prefix + N) entries per request at ``mask_indptr``), which both
sides use, so one implementation serves both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TypeVar

import torch

from kdtree_verify import ForwardLayout

ENV_VAR = "KDTREE_INJECT_FAULT"
KINDS = ("weight", "scale", "kv_drop", "tree_mask")
_USAGE = "expected weight:LAYER:SIZE[:SEED], scale:SIZE, kv_drop:POSITION or tree_mask:ROW"


class FaultSpecError(ValueError):
    """``KDTREE_INJECT_FAULT`` holds a value that names no fault; the message says why."""


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` and its size (relative size, factor, position or row)."""

    kind: str
    size: float
    layer: int | None = None  # weight only
    seed: int = 0  # weight only

    def describe(self) -> str:
        """The value that selects this fault, as ``KDTREE_INJECT_FAULT`` spells it."""
        if self.kind == "weight":
            return f"weight:{self.layer}:{self.size:g}:{self.seed}"
        if self.kind == "scale":
            return f"scale:{self.size:g}"
        return f"{self.kind}:{int(self.size)}"

    @property
    def index(self) -> int:
        """The position (kv_drop) or row (tree_mask)."""
        return int(self.size)


def parse_fault(raw: str | None) -> Fault | None:
    """``KDTREE_INJECT_FAULT``'s value as a :class:`Fault`; None when unset or empty."""
    text = (raw or "").strip()
    if not text:
        return None
    kind, _, rest = text.partition(":")
    fields = rest.split(":") if rest else []
    try:
        if kind == "weight" and len(fields) in (2, 3):
            layer, size = int(fields[0]), float(fields[1])
            seed = int(fields[2]) if len(fields) == 3 else 0
            if layer >= 0 and math.isfinite(size) and size > 0:
                return Fault("weight", size, layer=layer, seed=seed)
        elif kind == "scale" and len(fields) == 1:
            size = float(fields[0])
            if math.isfinite(size) and size != 0 and size > -1:
                return Fault("scale", size)
        elif kind in ("kv_drop", "tree_mask") and len(fields) == 1:
            index = int(fields[0])
            if index >= 0:
                return Fault(kind, float(index))
    except ValueError:
        pass
    raise FaultSpecError(f"{ENV_VAR}={raw!r}: {_USAGE}")


def banner(fault: Fault, where: str) -> str:
    """The loud start-up line both sides log."""
    return (
        f"FAULT INJECTION ACTIVE in {where}: {ENV_VAR}={fault.describe()} -- this server is "
        "deliberately wrong (parity-gate resolution testing only)"
    )


# ------------------------------------------------------------------------------- weights


def perturb_layer(
    weights: dict[str, torch.Tensor], layer: int, size: float, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A copy of ``weights`` (DeepSeek-V3 names) where every matrix of ``layer`` is ``W + dW``,
    ``dW`` seeded Gaussian with ``||dW||_F = size * ||W||_F``. Other tensors are shared."""
    prefix = f"model.layers.{layer}."
    names = sorted(n for n, w in weights.items() if n.startswith(prefix) and w.dim() == 2)
    if not names:
        raise FaultSpecError(f"{ENV_VAR}: the model has no layer {layer}")
    gen = torch.Generator().manual_seed(seed)
    out = dict(weights)
    for name in names:
        w = weights[name]
        noise = torch.randn(w.shape, generator=gen, dtype=torch.float32)
        noise *= size * w.float().norm() / noise.norm()
        out[name] = (w.float() + noise.to(w.device)).to(w.dtype)
    return out


# ----------------------------------------------------------------- verify-layout edits

# A forward's layout: the SGLang backend's marshaled inputs, the reference engine's metadata.
L = TypeVar("L", bound=ForwardLayout)


def drop_kv_position(layout: L, position: int) -> L:
    """``layout`` without the prefix row at ``position`` in every request whose committed prefix
    holds it (its queries all come after it), the tree mask's column for it removed too.

    Reads the index tensors on the host: eager forwards only (not under CUDA-graph capture).
    """
    qo = layout.qo_indptr.tolist()
    kv = layout.kv_indptr.tolist()
    batch = len(qo) - 1
    keep_indices, kv_out = [], [0]
    masks, mask_out = [], [0]
    for b in range(batch):
        lo, hi = kv[b], kv[b + 1]
        prefix = hi - lo
        rows = layout.kv_indices[lo:hi]
        drop = position < prefix
        if drop:
            rows = torch.cat([rows[:position], rows[position + 1 :]])
        keep_indices.append(rows)
        kv_out.append(kv_out[-1] + rows.shape[0])
        if layout.custom_mask is not None:
            n = qo[b + 1] - qo[b]
            start = int(layout.mask_indptr[b])
            block = layout.custom_mask[start : start + n * (prefix + n)].view(n, prefix + n)
            if drop:
                block = torch.cat([block[:, :position], block[:, position + 1 :]], dim=1)
            masks.append(block.reshape(-1))
            mask_out.append(mask_out[-1] + block.numel())
    device = layout.kv_indptr.device
    custom_mask = mask_indptr = None
    if layout.custom_mask is not None:
        custom_mask = torch.cat(masks)
        mask_indptr = torch.tensor(mask_out, dtype=layout.mask_indptr.dtype, device=device)
    return dataclasses.replace(
        layout,
        kv_indptr=torch.tensor(kv_out, dtype=layout.kv_indptr.dtype, device=device),
        kv_indices=torch.cat(keep_indices) if keep_indices else layout.kv_indices[:0],
        custom_mask=custom_mask,
        mask_indptr=mask_indptr,
    )


def extra_tree_node(layout: L, row: int) -> L:
    """``layout`` whose tree mask lets draft token ``row`` of every request also see the first
    draft node (lowest index) it does not see. A causal forward (no mask), a request with at most
    ``row`` draft tokens, or a row that already sees every node is left as it is.

    Reads the index tensors on the host: eager forwards only (not under CUDA-graph capture).
    """
    if layout.custom_mask is None:
        return layout
    qo = layout.qo_indptr.tolist()
    kv = layout.kv_indptr.tolist()
    mask = layout.custom_mask.clone()
    for b in range(len(qo) - 1):
        n, prefix = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if row >= n:
            continue
        start = int(layout.mask_indptr[b]) + row * (prefix + n) + prefix
        hidden = (~mask[start : start + n].bool()).nonzero()
        if hidden.numel():
            mask[start + int(hidden[0])] = True
    return dataclasses.replace(layout, custom_mask=mask)


def apply_to_layout(fault: Fault, layout: L) -> L:
    """The layout edit of ``fault`` (kv_drop, tree_mask) on a copy of ``layout`` (its type kept,
    its kernel metadata built afresh); other kinds leave it as it is."""
    if fault.kind == "kv_drop":
        return drop_kv_position(layout, fault.index)
    if fault.kind == "tree_mask":
        return extra_tree_node(layout, fault.index)
    return layout


def scaled_softmax(fault: Fault | None, sm_scale: float) -> float:
    """The softmax scale with a ``scale`` fault applied."""
    if fault is not None and fault.kind == "scale":
        return sm_scale * (1.0 + fault.size)
    return sm_scale
