"""SGLang's target-verify metadata -> the verify kernel's inputs, once per forward.

The kernel takes SGLang's own layout (docs/kernel.md, "The interface"), so no metadata is
copied: the inputs are references to the tensors SGLang's Triton backend keeps in ``forward_metadata``.
Under CUDA graphs those are SGLang's static capture buffers (``kv_indptr``,
``cuda_graph_kv_indices``, ``qo_indptr``, the uint8 verify-mask buffer, ``mask_indptr``), which
``init_forward_metadata_out_graph`` refreshes before every replay.

What is computed per forward is the kernel's schedule (``kdtree_verify.plan``): a ``VerifyPlan``
per static shape (batch size, heads, draft tokens), allocated once outside any graph and
``update``d once per forward from ``qo_indptr``/``kv_indptr`` by a small device kernel (no host
sync, no allocation), then shared by every layer. Its workspace is bounded by the formula in
``kdtree_verify.plan``.

On CPU there is no plan. SGLang's ``kv_indices`` may be longer than the batch uses (graph buffers
are sized for the maximum context); the op reads only up to ``kv_indptr[-1]`` on every device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from kdtree_verify import ForwardLayout
from kdtree_verify.plan import VerifyPlan, make_plan


@dataclass(frozen=True, kw_only=True)
class VerifyInputs(ForwardLayout):
    """SGLang's metadata of one verify forward, as the kernel's layout (with a ``plan`` on CUDA)
    and the batch's static shape."""

    batch_size: int
    total_tokens: int


class MarshalError(ValueError):
    """SGLang's metadata is not in the target-verify shape this backend relies on."""


class VerifyMarshal:
    """Builds :class:`VerifyInputs` per forward and owns the kernel plans (one per shape).

    Plans of captured graphs are kept for the graphs' lifetime (their workspace addresses are
    baked into the graphs). Eager forwards come in many shapes, and a plan's workspace can be
    tens of MB at small batches (split-KV partials), so at most ``eager_plans`` of theirs are
    kept, least recently used first out; freeing one is stream-ordered, so kernels still queued
    on it are safe.
    """

    def __init__(
        self, device: torch.device, num_heads: int, dtype: torch.dtype, eager_plans: int = 4
    ) -> None:
        self.device = torch.device(device)
        self.num_heads = num_heads
        self.dtype = dtype
        self.eager_plans = eager_plans
        self._graph_plans: dict[tuple[int, int], VerifyPlan] = {}
        self._eager_plans: OrderedDict[tuple[int, int], VerifyPlan] = OrderedDict()

    def _plan(self, batch_size: int, total_tokens: int, for_graph: bool) -> VerifyPlan | None:
        if self.device.type != "cuda":
            return None
        key = (batch_size, total_tokens)
        plan = self._graph_plans.get(key)
        if plan is not None:
            return plan
        plan = self._eager_plans.pop(key, None)
        if plan is None:
            plan = make_plan(
                batch_size, self.num_heads, total_tokens, self.device, dtype=self.dtype
            )
        if for_graph:
            self._graph_plans[key] = plan
        else:
            self._eager_plans[key] = plan
            while len(self._eager_plans) > self.eager_plans:
                self._eager_plans.popitem(last=False)
        return plan

    def build(self, metadata: Any, for_graph: bool = False) -> VerifyInputs:
        """Inputs for a Triton ``ForwardMetadata`` of a target-verify forward.

        ``for_graph``: the forward is a CUDA-graph capture (its plan is kept with the graph).
        Reads shapes and host fields only on CUDA; call it before capture (SGLang's
        ``init_forward_metadata_out_graph`` runs outside ``torch.cuda.graph``), since a new plan
        allocates its workspace.
        """
        qo_indptr, kv_indptr = metadata.qo_indptr, metadata.kv_indptr
        if qo_indptr is None or kv_indptr is None or metadata.kv_indices is None:
            raise MarshalError("target-verify metadata lacks qo_indptr, kv_indptr or kv_indices")
        batch_size = qo_indptr.shape[0] - 1
        if kv_indptr.shape[0] != batch_size + 1:
            raise MarshalError(
                f"kv_indptr has {kv_indptr.shape[0]} entries but qo_indptr has {batch_size + 1}"
            )
        if not metadata.max_extend_len:
            raise MarshalError("target-verify metadata has no max_extend_len (draft tokens)")
        # On target verify every request has the same N draft tokens (qo_indptr = arange x N).
        total_tokens = batch_size * int(metadata.max_extend_len)
        kv_indices = metadata.kv_indices
        custom_mask = metadata.custom_mask
        mask_indptr = None
        if custom_mask is not None:
            mask_indptr = metadata.mask_indptr[: batch_size + 1]
        plan = self._plan(batch_size, total_tokens, for_graph)
        if plan is not None:
            plan.update(qo_indptr, kv_indptr, mask_indptr)
        return VerifyInputs(
            batch_size=batch_size,
            total_tokens=total_tokens,
            qo_indptr=qo_indptr,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            custom_mask=custom_mask,
            mask_indptr=mask_indptr,
            plan=plan,
        )

    def refresh(
        self,
        batch_size: int,
        total_tokens: int,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        mask_indptr: torch.Tensor | None,
    ) -> None:
        """Before a graph replay: re-plan from the refreshed static metadata buffers.

        Only on CUDA, for a shape built with ``for_graph=True`` (anything else is a caller bug:
        the replay would run on a stale schedule).
        """
        plan = self._graph_plans.get((batch_size, total_tokens))
        if plan is None:
            raise KeyError(
                f"no graph plan for batch {batch_size} x {total_tokens} tokens on {self.device}; "
                "build(metadata, for_graph=True) at capture first"
            )
        plan.update(qo_indptr, kv_indptr, mask_indptr)
