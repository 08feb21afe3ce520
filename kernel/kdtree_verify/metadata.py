"""The per-forward half of a verify call: indptrs, indices, the draft mask, the split plan and the
softmax scale, built and validated once per forward and shared by every layer (like FlashInfer's
``BatchMLAPagedAttentionWrapper.plan`` or FlashMLA's scheduling metadata).

The per-layer half (q, the draft KV, the pool and its scales) is ``verify_attention``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .plan import VerifyPlan
from .validation import VerifyInputError, validate_metadata, validate_sm_scale

DEFAULT_CHUNK_SIZE = 256
"""Prefix tokens per split in the CPU specification (the kernel plans its own split size)."""


def check_contiguous(tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    """The CUDA kernel reads index and mask tensors by position: refuse strided ones by name
    (the extension would only stop with a RuntimeError). The CPU op accepts strided indices."""
    for name, t in tensors:
        if not t.is_contiguous():
            raise VerifyInputError(
                f"{name}: the CUDA kernel reads it by position, so it must be contiguous; got "
                f"strides {t.stride()}"
            )


@dataclass(frozen=True)
class VerifyMetadata:
    """One verify forward's metadata in SGLang's target-verify layout (docs/kernel.md).

    Build it with :meth:`build`, which validates it; the constructor itself checks nothing (the
    op's own implementations use it on arguments already validated). ``plan``: the CUDA kernel's
    schedule, already ``update``d for these indptrs (``None``: the op plans per call on CUDA).
    ``chunk_size``: the prefix split size of the CPU implementation.
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    sm_scale: float
    plan: VerifyPlan | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE

    @classmethod
    def build(
        cls,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        custom_mask: torch.Tensor | None,
        mask_indptr: torch.Tensor | None,
        sm_scale: float,
        *,
        plan: VerifyPlan | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> VerifyMetadata:
        """Validate (shapes, dtypes, the plan's workspace: no host sync) and build.

        ``mask_indptr`` is ignored without a mask (the draft block is then causal).
        """
        validate_metadata(
            qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr, sm_scale, chunk_size
        )
        metadata = cls(
            qo_indptr,
            kv_indptr,
            kv_indices,
            custom_mask,
            mask_indptr if custom_mask is not None else None,
            float(sm_scale),
            plan,
            int(chunk_size),
        )
        if plan is not None:
            metadata.check_plan()
        return metadata

    def with_sm_scale(self, sm_scale: float) -> VerifyMetadata:
        """The same metadata with another softmax scale (validated)."""
        validate_sm_scale(sm_scale)
        return dataclasses.replace(self, sm_scale=float(sm_scale))

    @property
    def batch_size(self) -> int:
        return self.qo_indptr.shape[0] - 1

    @property
    def causal(self) -> bool:
        """No mask: draft token i sees draft tokens 0..i."""
        return self.custom_mask is None

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The index and mask tensors the kernel reads, by argument name."""
        yield "qo_indptr", self.qo_indptr
        yield "kv_indptr", self.kv_indptr
        yield "kv_indices", self.kv_indices
        if self.custom_mask is not None:
            yield "custom_mask", self.custom_mask
            assert self.mask_indptr is not None
            yield "mask_indptr", self.mask_indptr

    def check_plan(self) -> None:
        """What the CUDA kernel needs of a planned forward: index and mask tensors contiguous, a
        plan for this batch whose workspace holds its layout on the metadata's device."""
        plan = self.plan
        assert plan is not None
        check_contiguous(self.named_tensors())
        if plan.batch_size != self.batch_size:
            raise VerifyInputError(
                f"plan: made for batch {plan.batch_size}; the metadata has {self.batch_size}"
            )
        device = self.qo_indptr.device
        if plan.workspace.device != device:
            raise VerifyInputError(
                f"plan.workspace: is on {plan.workspace.device} but qo_indptr is on {device}"
            )
        plan.check_workspace()


@dataclass(frozen=True)
class ForwardLayout:
    """A verify forward's index and mask tensors (SGLang's layout: prefix-only ``kv_indices``)
    before its softmax scale is known, with the kernel's ``plan`` where the caller made one.

    SGLang's backends get the scale with each layer call, not with the forward's metadata: they
    keep one ``ForwardLayout`` per forward (the backend's marshaled inputs and the reference
    engine's metadata extend it), and every layer of a scale shares the ``VerifyMetadata`` that
    :meth:`kernel_metadata` builds and validates on first use. ``dataclasses.replace`` makes a
    layout whose metadata is built afresh.
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    plan: VerifyPlan | None = None
    _by_scale: dict[float, VerifyMetadata] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def kernel_metadata(self, sm_scale: float) -> VerifyMetadata:
        """The forward's metadata at ``sm_scale`` (one build per forward and scale; host work
        only, so it may run under CUDA-graph capture)."""
        metadata = self._by_scale.get(sm_scale)
        if metadata is None:
            metadata = VerifyMetadata.build(
                self.qo_indptr,
                self.kv_indptr,
                self.kv_indices,
                self.custom_mask,
                self.mask_indptr,
                sm_scale,
                plan=self.plan,
            )
            self._by_scale[sm_scale] = metadata
        return metadata
