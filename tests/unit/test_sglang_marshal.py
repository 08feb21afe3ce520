"""VerifyMarshal on CPU: SGLang's metadata passes through by reference, kv_indices is trimmed."""

from types import SimpleNamespace

import pytest
import torch

from kdtree_inference.sglang.marshal import MarshalError, VerifyMarshal
from kdtree_verify import VerifyInputError


def metadata(**overrides):
    fields = dict(
        qo_indptr=torch.tensor([0, 4, 8], dtype=torch.int64),
        kv_indptr=torch.tensor([0, 5, 12], dtype=torch.int32),
        kv_indices=torch.arange(100),  # a graph buffer: longer than the prefix
        custom_mask=torch.ones(200, dtype=torch.uint8),
        mask_indptr=torch.tensor([0, 36, 100, 0, 0], dtype=torch.int64),
        max_extend_len=4,
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_inputs_reference_sglang_tensors():
    md = metadata()
    inputs = VerifyMarshal(torch.device("cpu"), 16, torch.float32).build(md)
    assert (inputs.batch_size, inputs.total_tokens, inputs.plan) == (2, 8, None)
    assert inputs.qo_indptr is md.qo_indptr and inputs.kv_indptr is md.kv_indptr
    assert inputs.custom_mask is md.custom_mask
    assert inputs.kv_indices is md.kv_indices  # SGLang's whole buffer; the op reads kv_indptr[-1]
    assert inputs.mask_indptr.tolist() == [0, 36, 100]


def test_causal_draft_has_no_mask_indptr():
    inputs = VerifyMarshal(torch.device("cpu"), 16, torch.float32).build(metadata(custom_mask=None))
    assert inputs.custom_mask is None and inputs.mask_indptr is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_indices": None}, "lacks qo_indptr, kv_indptr or kv_indices"),
        ({"kv_indptr": torch.tensor([0, 5], dtype=torch.int32)}, "kv_indptr has 2 entries"),
        ({"max_extend_len": None}, "no max_extend_len"),
    ],
)
def test_malformed_metadata_is_named(change, message):
    with pytest.raises(MarshalError, match=message):
        VerifyMarshal(torch.device("cpu"), 16, torch.float32).build(metadata(**change))


def test_refresh_without_a_graph_plan_is_an_error():
    marshal = VerifyMarshal(torch.device("cpu"), 16, torch.float32)
    marshal.build(metadata(), for_graph=True)  # CPU: no plan exists
    md = metadata()
    with pytest.raises(KeyError, match="no graph plan for batch 2 x 8 tokens"):
        marshal.refresh(2, 8, md.qo_indptr, md.kv_indptr, None)


def test_kernel_metadata_is_built_once_per_forward_and_scale():
    """Every layer of a forward shares one validated VerifyMetadata per softmax scale."""
    inputs = VerifyMarshal(torch.device("cpu"), 16, torch.float32).build(metadata())
    first = inputs.kernel_metadata(0.1352)
    assert inputs.kernel_metadata(0.1352) is first
    assert first.qo_indptr is inputs.qo_indptr and first.kv_indices is inputs.kv_indices
    assert first.mask_indptr is inputs.mask_indptr and first.plan is None
    other = inputs.kernel_metadata(0.5)
    assert other is not first and other.sm_scale == 0.5
    with pytest.raises(VerifyInputError, match="sm_scale: must be a positive number"):
        inputs.kernel_metadata(0.0)
