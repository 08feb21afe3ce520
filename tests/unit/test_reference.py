"""The reference against an independent dense computation written plainly here."""

import math

import pytest
import torch

from kdtree_verify import verify_attention_reference
from kdtree_verify.testing import make_case


def dense_attention_by_hand(case) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request, per draft token, per head: scores over every key it may see, softmax, sum.

    Visibility is derived from the flat mask indices directly (row i of request b starts at
    mask_indptr[b] + i * (prefix + N)), not through any helper of the package.
    """
    q, kb, vb = case.q.double(), case.k_buffer.double(), case.v_buffer.double()
    ke, ve = case.k_extend.double(), case.v_extend.double()
    total, heads, _ = q.shape
    out = torch.zeros(total, heads, 512, dtype=torch.float64)
    lse = torch.zeros(total, heads, dtype=torch.float64)
    qo, kv = case.qo_indptr.tolist(), case.kv_indptr.tolist()
    mask = None if case.custom_mask is None else case.custom_mask.tolist()
    mstart = None if case.mask_indptr is None else case.mask_indptr.tolist()
    for b in range(len(qo) - 1):
        slots = case.kv_indices[kv[b] : kv[b + 1]].tolist()
        n, prefix = qo[b + 1] - qo[b], len(slots)
        for i in range(n):
            t = qo[b] + i
            keys = [kb[s, 0] for s in slots]
            vals = [vb[s, 0] for s in slots]
            for j in range(n):
                if mask is None:
                    visible = j <= i
                else:
                    visible = mask[mstart[b] + i * (prefix + n) + prefix + j] != 0
                if visible:
                    keys.append(ke[qo[b] + j, 0])
                    vals.append(ve[qo[b] + j, 0])
            k_mat, v_mat = torch.stack(keys), torch.stack(vals)
            for h in range(heads):
                scores = (k_mat @ q[t, h]) * case.sm_scale
                top = scores.max()
                weights = torch.exp(scores - top)
                out[t, h] = weights @ v_mat / weights.sum()
                lse[t, h] = top + math.log(weights.sum())
    return out, lse


CASES = [
    dict(prefix_lens=[0], num_draft=1, num_heads=1, mask="tree"),
    dict(prefix_lens=[9], num_draft=1, num_heads=3, mask="causal"),
    dict(prefix_lens=[0, 13, 4], num_draft=6, num_heads=2, mask="tree"),
    dict(prefix_lens=[31, 0], num_draft=5, num_heads=4, mask="chain", mask_dtype=torch.bool),
    dict(prefix_lens=[7, 20], num_draft=4, num_heads=2, mask="causal", index_dtype=torch.int32),
    dict(prefix_lens=[40], num_draft=8, num_heads=2, mask="tree", strided_v=False),
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_reference_matches_dense_by_hand(spec):
    case = make_case(**spec, seed=11)
    out, lse = verify_attention_reference(*case.args(), return_lse=True)
    expected_out, expected_lse = dense_attention_by_hand(case)
    torch.testing.assert_close(out.double(), expected_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), expected_lse, atol=2e-5, rtol=1e-5)


def test_reference_output_dtype_follows_q_and_lse_is_float32():
    case = make_case([5, 3], 3, 2, dtype=torch.bfloat16, seed=2)
    out, lse = verify_attention_reference(*case.args(), return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (6, 2, 512)
    assert lse.dtype == torch.float32 and lse.shape == (6, 2)


def test_the_tree_mask_changes_the_answer():
    """Guards against a mask that is silently ignored: a tree and a causal block must differ."""
    tree = make_case([3], 8, 2, mask="tree", seed=5)
    causal = make_case([3], 8, 2, mask="causal", seed=5)
    torch.testing.assert_close(tree.q, causal.q)
    out_tree = verify_attention_reference(*tree.args())
    out_causal = verify_attention_reference(*causal.args())
    assert (out_tree - out_causal).abs().max() > 1e-3
