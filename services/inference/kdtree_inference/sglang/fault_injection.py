"""The SGLang backend's side of ``KDTREE_INJECT_FAULT`` (TEST ONLY; see ``kdtree_inference.faults``).

Applied in the kdtree path only: target-verify forwards that the kernel serves with
KDTREE_VERIFY=on (prefill, the draft model and every layer the kernel does not serve stay
stock). ``scale`` multiplies the kernel's softmax scale; ``kv_drop`` and ``tree_mask`` edit the
forward's marshaled inputs once, before the kernel's plan is updated, and read index tensors on
the host, so they need eager forwards (``--disable-cuda-graph``); a CUDA-graph capture with one
of them set is refused. ``weight`` faults are not served here: write a perturbed model copy with
``bench/kdtree_bench/models/make_model.py --perturb LAYER:SIZE``.
"""

from __future__ import annotations

from ..faults import Fault, apply_to_layout
from .forward_state import Phase
from .marshal import VerifyInputs

LAYOUT_KINDS = ("kv_drop", "tree_mask")


class FaultNeedsEagerError(RuntimeError):
    """A layout fault met a CUDA-graph capture, where the host cannot read the indices."""


def faulty_inputs(inputs: VerifyInputs, fault: Fault | None, phase: Phase) -> VerifyInputs:
    """``inputs`` with ``fault``'s layout edit, the kernel plan re-planned on the edited
    indices; unchanged for no fault or a ``scale`` fault. ``phase``: eager, capture or replay."""
    if fault is None or fault.kind not in LAYOUT_KINDS:
        return inputs
    if phase is not Phase.EAGER:
        raise FaultNeedsEagerError(
            f"KDTREE_INJECT_FAULT={fault.describe()} edits the verify indices on the host and "
            "cannot be captured in a CUDA graph: start the server with --disable-cuda-graph"
        )
    faulty = apply_to_layout(fault, inputs)
    if faulty.plan is not None:
        faulty.plan.update(faulty.qo_indptr, faulty.kv_indptr, faulty.mask_indptr)
    return faulty
