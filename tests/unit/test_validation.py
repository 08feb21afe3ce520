"""Every validation error of the verify op, by message."""

import re

import pytest
import torch

from kdtree_verify import (
    VerifyInputError,
    VerifyMetadata,
    verify_attention,
    verify_attention_reference,
)
from kdtree_verify.testing import make_case

METADATA_NAMES = ("qo_indptr", "kv_indptr", "kv_indices", "custom_mask", "mask_indptr", "sm_scale")
LAYER_NAMES = ("q", "k_extend", "v_extend", "k_buffer", "v_buffer")


def _args(**overrides):
    """Every argument of a call by name (the metadata's and the layer's), with ``overrides``."""
    case = make_case([4, 0, 6], 3, 2, mask="tree", seed=0)
    args = {name: getattr(case, name) for name in METADATA_NAMES + LAYER_NAMES}
    args.update(overrides)
    return args, case


def _call(entry, args):
    """``entry`` on the metadata built from ``args``, then the layer's arguments."""
    metadata = VerifyMetadata.build(**{name: args[name] for name in METADATA_NAMES})
    return entry(metadata, **{name: v for name, v in args.items() if name not in METADATA_NAMES})


def _t(**kw):
    return kw


BAD_INPUTS = [
    # (overrides built from the case, expected message)
    (lambda c: _t(q=c.q[..., :512]), r"q: last dim must be 576"),
    (lambda c: _t(q=c.q[0]), r"q: expected 3 dims"),
    (lambda c: _t(q=c.q.to(torch.int32)), r"q: dtype must be one of"),
    (
        lambda c: _t(k_extend=c.k_extend[:-1]),
        r"k_extend: expected shape \(9, 1, 576\) to match q, got \(8, 1, 576\)",
    ),
    (lambda c: _t(v_extend=c.v_extend[..., :256]), r"v_extend: expected shape \(9, 1, 512\)"),
    (
        lambda c: _t(k_buffer=c.k_buffer.expand(-1, 2, -1)),
        r"k_buffer: expected shape \[pool, 1, 576\]",
    ),
    (lambda c: _t(v_buffer=c.v_buffer[:-1]), r"v_buffer: pool size \d+ differs from k_buffer's"),
    (
        lambda c: _t(k_buffer=c.k_buffer.to(torch.float16)),
        r"k_buffer: dtype torch.float16 differs from torch.float32 \(the pool is in q's dtype",
    ),
    (
        lambda c: _t(k_buffer=c.k_buffer.to(torch.float8_e4m3fn)),
        r"v_buffer: dtype torch.float32 differs from torch.float8_e4m3fn",
    ),
    (
        lambda c: _t(
            k_buffer=c.k_buffer.to(torch.float8_e5m2), v_buffer=c.v_buffer.to(torch.float8_e5m2)
        ),
        r"k_buffer: dtype torch.float8_e5m2 differs from torch.float32",
    ),
    (
        lambda c: _t(k_extend=c.k_extend.to(torch.float8_e4m3fn)),
        r"k_extend: dtype torch.float8_e4m3fn differs from torch.float32",
    ),
    (lambda c: _t(k_scale=0.5), r"k_scale: is 0.5, but only a float8_e4m3fn pool is scaled"),
    (lambda c: _t(v_scale=2.0), r"v_scale: is 2.0, but only a float8_e4m3fn pool is scaled"),
    (
        lambda c: _t(
            k_buffer=c.k_buffer.to(torch.float8_e4m3fn),
            v_buffer=c.v_buffer.to(torch.float8_e4m3fn),
            k_scale=0.0,
        ),
        r"k_scale: must be a positive finite number, got 0.0",
    ),
    (
        lambda c: _t(
            k_buffer=c.k_buffer.to(torch.float8_e4m3fn),
            v_buffer=c.v_buffer.to(torch.float8_e4m3fn),
            v_scale=float("inf"),
        ),
        r"v_scale: must be a positive finite number",
    ),
    (
        lambda c: _t(
            q=c.q.half(),
            k_extend=c.k_extend.half(),
            v_extend=c.v_extend.half(),
            k_buffer=c.k_buffer.to(torch.float8_e4m3fn),
            v_buffer=c.v_buffer.to(torch.float8_e4m3fn),
            v_scale=300.0,
        ),
        r"v_scale: must be <= 255.0 with an fp8 pool",
    ),
    (
        lambda c: _t(
            k_buffer=c.k_buffer.to(torch.float8_e4m3fn),
            v_buffer=c.v_buffer.to(torch.float8_e4m3fn),
            v_scale=256.0,
        ),
        r"v_scale: must be <= 255.0 with an fp8 pool",
    ),
    (
        lambda c: _t(k_extend=torch.randn(1, 576, 9).permute(2, 0, 1)),
        r"k_extend: the last dimension must be contiguous",
    ),
    (lambda c: _t(qo_indptr=c.qo_indptr.float()), r"qo_indptr: dtype must be int32 or int64"),
    (lambda c: _t(qo_indptr=c.qo_indptr[:1]), r"qo_indptr: needs at least 2 entries"),
    (lambda c: _t(kv_indptr=c.kv_indptr[:-1]), r"kv_indptr: has 3 entries, qo_indptr has 4"),
    (lambda c: _t(kv_indices=c.kv_indices.view(2, -1)), r"kv_indices: expected 1 dims"),
    (
        lambda c: _t(kv_indices=c.kv_indices.to(torch.int16)),
        r"kv_indices: dtype must be int32 or int64",
    ),
    (lambda c: _t(custom_mask=c.custom_mask.float()), r"custom_mask: dtype must be bool or uint8"),
    (lambda c: _t(custom_mask=c.custom_mask.view(1, -1)), r"custom_mask: expected 1 dims"),
    (lambda c: _t(mask_indptr=None), r"mask_indptr: is required when custom_mask is given"),
    (lambda c: _t(mask_indptr=c.mask_indptr[:-1]), r"mask_indptr: has 3 entries, expected 4"),
    (lambda c: _t(mask_indptr=c.mask_indptr.float()), r"mask_indptr: dtype must be int32 or int64"),
    (lambda c: _t(sm_scale=0.0), r"sm_scale: must be a positive number"),
    (lambda c: _t(sm_scale="0.1"), r"sm_scale: must be a positive number"),
    # value checks (run on CPU tensors, or on GPU when check_values=True)
    (lambda c: _t(qo_indptr=c.qo_indptr + 1), r"qo_indptr: must start at 0, got 1"),
    (
        lambda c: _t(qo_indptr=torch.tensor([0, 3, 2, 9])),
        r"qo_indptr: must be non-decreasing, but entry 2 \(2\) < entry 1 \(3\)",
    ),
    (
        lambda c: _t(qo_indptr=torch.tensor([0, 3, 6, 8])),
        r"qo_indptr: last entry is 8 but q's token count is 9",
    ),
    (
        lambda c: _t(kv_indptr=torch.tensor([0, 4, 4, 11])),
        r"kv_indptr: last entry is 11 but len\(kv_indices\) is 10",
    ),
    (
        lambda c: _t(kv_indices=c.kv_indices.clone().fill_(10_000)),
        r"kv_indices: values must lie in \[0, \d+\), found range \[10000, 10000\]",
    ),
    (lambda c: _t(kv_indices=c.kv_indices.clone().fill_(-1)), r"kv_indices: values must lie in"),
    (
        lambda c: _t(mask_indptr=c.mask_indptr * 2),
        r"mask_indptr: entry 1 is 42, expected 21 \(cumsum of N x \(prefix_len \+ N\) per request\)",
    ),
    (
        lambda c: _t(custom_mask=c.custom_mask[:-1]),
        r"custom_mask: has \d+ elements but mask_indptr needs \d+",
    ),
]


@pytest.mark.parametrize("build, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
@pytest.mark.parametrize(
    "entry", [verify_attention, verify_attention_reference], ids=["op", "reference"]
)
def test_bad_input_is_refused_with_a_message_naming_it(entry, build, message):
    _, case = _args()
    args, _ = _args(**build(case))
    with pytest.raises(VerifyInputError, match=message):
        _call(entry, args)


def test_device_mismatch_is_named():
    _, case = _args()
    meta_mask = case.custom_mask.to("meta")
    args, _ = _args(custom_mask=meta_mask)
    with pytest.raises(
        VerifyInputError, match=re.escape("custom_mask: is on meta but q is on cpu")
    ):
        _call(verify_attention, args)


def test_error_is_a_value_error_so_callers_can_fall_back():
    assert issubclass(VerifyInputError, ValueError)


def test_a_larger_mask_buffer_than_needed_is_accepted():
    """SGLang's graph path passes a static mask buffer longer than this batch needs."""
    args, case = _args()
    args["custom_mask"] = torch.cat(
        [case.custom_mask, torch.zeros(100, dtype=case.custom_mask.dtype)]
    )
    torch.testing.assert_close(_call(verify_attention, args), verify_attention(*case.args()))


def test_chunk_size_must_be_positive():
    _, case = _args()
    with pytest.raises(ValueError, match="chunk_size: must be >= 1"):
        verify_attention(*case.args(chunk_size=0))


def test_kv_indices_may_be_a_longer_buffer_than_the_batch_uses():
    """SGLang passes its kv_indices buffer whole; entries past kv_indptr[-1] are never read, even
    when they hold garbage."""
    args, case = _args()
    args["kv_indices"] = torch.cat(
        [case.kv_indices, torch.full((50,), 10**6, dtype=case.kv_indices.dtype)]
    )
    torch.testing.assert_close(_call(verify_attention, args), verify_attention(*case.args()))
    torch.testing.assert_close(
        _call(verify_attention_reference, args), verify_attention_reference(*case.args())
    )


def test_cuda_path_refuses_strided_indices_and_outputs_elsewhere_by_name():
    """The CUDA path's own layout rules, on CPU tensors: the kernel reads index and mask tensors
    by position (``metadata.check_contiguous``), and writes out and lse on q's device
    (``cuda.check_outputs``)."""
    from kdtree_verify.cuda import check_outputs
    from kdtree_verify.metadata import check_contiguous

    _, case = _args()
    out = torch.empty(9, 2, 512)
    lse = torch.empty(9, 2)
    strided = torch.arange(20)[::2]
    check_contiguous(iter([("kv_indices", case.kv_indices)]))
    check_outputs(case.q, {"out": out, "lse": lse})
    with pytest.raises(VerifyInputError, match=r"kv_indices: the CUDA kernel reads it by position"):
        check_contiguous(iter([("kv_indices", strided)]))
    with pytest.raises(VerifyInputError, match=r"custom_mask: .* strides \(2,\)"):
        check_contiguous(iter([("custom_mask", torch.zeros(20, dtype=torch.uint8)[::2])]))
    with pytest.raises(VerifyInputError, match=re.escape("lse: is on meta but q is on cpu")):
        check_outputs(case.q, {"out": out, "lse": lse.to("meta")})


def test_planned_metadata_refuses_strided_indices_and_a_plan_for_another_batch():
    """Metadata with a plan is the CUDA kernel's: its layout rules are checked once, when built."""
    from kdtree_verify.plan import make_plan

    _, case = _args()
    plan = make_plan(3, 2, 9, "meta", target_ctas=132)
    spaced = torch.zeros(2 * case.kv_indices.numel(), dtype=case.kv_indices.dtype)
    spaced[::2] = case.kv_indices
    with pytest.raises(VerifyInputError, match=r"kv_indices: the CUDA kernel reads it by position"):
        VerifyMetadata.build(
            case.qo_indptr,
            case.kv_indptr,
            spaced[::2],
            case.custom_mask,
            case.mask_indptr,
            case.sm_scale,
            plan=plan,
        )
    with pytest.raises(VerifyInputError, match=r"plan: made for batch 4; the metadata has 3"):
        case.metadata(plan=make_plan(4, 2, 9, "meta", target_ctas=132))


def test_cuda_path_refuses_a_plan_made_for_another_device():
    """Building the metadata checks the plan's workspace before anything plans or loads the
    extension."""
    from kdtree_verify.plan import make_plan

    case = make_case([4, 0, 6], 3, 2, mask="tree", seed=0, dtype=torch.bfloat16)
    plan = make_plan(3, 2, 9, "meta", target_ctas=132)
    with pytest.raises(VerifyInputError, match=re.escape("plan.workspace: is on meta")):
        case.metadata(plan=plan)
