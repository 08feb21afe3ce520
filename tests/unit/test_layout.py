"""Layout helpers: right values, and no host sync (they run on meta tensors, which have no data)."""

import torch

from kdtree_verify import layout
from kdtree_verify.testing import make_case


def _sglang_mask_indptr(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> torch.Tensor:
    """What SGLang's TritonAttnBackend builds for target verify, written the way it does."""
    bs = qo_indptr.shape[0] - 1
    num_draft = qo_indptr[1:] - qo_indptr[:-1]
    seq_mask_len = num_draft * (kv_indptr[1:] - kv_indptr[:-1] + num_draft)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    mask_indptr[1 : bs + 1] = torch.cumsum(seq_mask_len, dim=0)
    return mask_indptr


def test_values_match_the_metadata_they_come_from():
    case = make_case([0, 17, 5, 64], 6, 2, seed=3)
    buf = torch.full((8,), -1, dtype=torch.int64)
    assert layout.prefix_lengths(case.kv_indptr, buf).tolist() == [0, 17, 5, 64]
    assert layout.draft_counts(case.qo_indptr, buf).tolist() == [6, 6, 6, 6]
    assert layout.mask_row_strides(case.qo_indptr, case.kv_indptr, buf).tolist() == [6, 23, 11, 70]
    assert buf[4:].tolist() == [-1] * 4, "helpers write only the valid part of a static buffer"
    got = layout.mask_indptr_from_lengths(case.qo_indptr, case.kv_indptr, buf)
    assert (
        got.tolist()
        == case.mask_indptr.tolist()
        == _sglang_mask_indptr(case.qo_indptr, case.kv_indptr).tolist()
    )
    slots = torch.zeros(30, dtype=torch.int32)
    assert layout.draft_slots(case.out_cache_loc, slots).tolist() == case.out_cache_loc.tolist()


def test_helpers_run_without_reading_tensor_values():
    """Meta tensors carry no data: any .item()/.tolist()/data-dependent shape would raise here."""
    qo = torch.empty(9, dtype=torch.int64, device="meta")
    kv = torch.empty(9, dtype=torch.int32, device="meta")
    out = torch.empty(16, dtype=torch.int64, device="meta")
    assert layout.prefix_lengths(kv, out).shape == (8,)
    assert layout.draft_counts(qo, out).shape == (8,)
    assert layout.mask_row_strides(qo, kv, out).shape == (8,)
    assert layout.mask_indptr_from_lengths(qo, kv, out).shape == (9,)
    assert layout.draft_slots(
        torch.empty(40, dtype=torch.int64, device="meta"), torch.empty(64, device="meta")
    ).shape == (40,)


def test_too_small_buffer_is_refused():
    case = make_case([1, 2], 3, 1)
    try:
        layout.mask_indptr_from_lengths(
            case.qo_indptr, case.kv_indptr, torch.empty(2, dtype=torch.int64)
        )
    except ValueError as e:
        assert "needs a 1-D buffer of at least 3 entries" in str(e)
    else:
        raise AssertionError("a 2-entry buffer for a 3-entry indptr must be refused")
