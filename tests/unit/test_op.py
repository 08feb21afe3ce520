"""The custom op: registration, fake implementation, and the CPU specification's numerics."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kdtree_verify import merge_partials, verify_attention, verify_attention_reference
from kdtree_verify.op import op_arguments
from kdtree_verify.testing import boost_prefix_keys, make_case


def test_op_is_registered_and_passes_torch_opcheck():
    case = make_case([0, 9, 40], 4, 3, seed=1)
    args = op_arguments(*case.args(chunk_size=16))
    torch.library.opcheck(torch.ops.kdtree.verify_attention.default, args)


def test_fake_implementation_gives_shapes_without_computing():
    case = make_case([3, 5], 4, 7, dtype=torch.bfloat16, seed=1)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [
            mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
            for a in op_arguments(*case.args())
        ]
        out, lse = torch.ops.kdtree.verify_attention(*fake_args)
    assert out.shape == (8, 7, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (8, 7) and lse.dtype == torch.float32


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 4096])
def test_cpu_op_equals_reference_in_float32_for_any_chunking(chunk_size):
    case = make_case([0, 1, 63, 64, 65, 130], 5, 4, mask="tree", seed=4)
    ref, ref_lse = verify_attention_reference(*case.args(), return_lse=True)
    out, lse = verify_attention(*case.args(chunk_size=chunk_size), return_lse=True)
    torch.testing.assert_close(out, ref, atol=3e-6, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=3e-6, rtol=1e-6)


def test_cpu_op_in_bf16_is_within_bf16_rounding_of_the_float32_reference():
    """With bf16 inputs the op rounds P to bf16 before P @ V (as the kernel's tensor cores do) and
    rounds the output to bf16: each costs at most ~2^-8 relative, so the output stays within a few
    bf16 ulps of the float32 reference on the same inputs."""
    case = make_case([0, 200, 37], 8, 8, mask="tree", dtype=torch.bfloat16, seed=5)
    ref = verify_attention_reference(*case.args()).float()
    out = verify_attention(*case.args(chunk_size=64)).float()
    scale = ref.abs().amax(dim=-1, keepdim=True)
    assert ((out - ref).abs() / scale).max() < 2 * 2**-8


def test_merge_of_partials_ignores_empty_ones_and_is_order_free():
    torch.manual_seed(0)
    outs = [torch.randn(3, 2, 4) for _ in range(3)]
    lses = [torch.randn(3, 2), torch.full((3, 2), float("-inf")), torch.randn(3, 2)]
    out, lse = merge_partials(outs, lses)
    expected_lse = torch.logaddexp(lses[0], lses[2])
    w0, w2 = torch.exp(lses[0] - expected_lse), torch.exp(lses[2] - expected_lse)
    torch.testing.assert_close(lse, expected_lse)
    torch.testing.assert_close(out, w0[..., None] * outs[0] + w2[..., None] * outs[2])
    out_rev, lse_rev = merge_partials(outs[::-1], lses[::-1])
    torch.testing.assert_close(out_rev, out)
    torch.testing.assert_close(lse_rev, lse)


def test_merge_of_only_empty_partials_is_zero_not_nan():
    out, lse = merge_partials([torch.ones(2, 4)] * 2, [torch.full((2,), float("-inf"))] * 2)
    assert torch.equal(out, torch.zeros(2, 4))
    assert torch.isneginf(lse).all()


def test_cpu_op_follows_late_score_jumps_and_an_early_spike():
    """Scores that jump far above the running max in late chunks (and one early spike that leaves
    later chunks negligible) are merged exactly: the split-KV specification against the
    reference, in float32, with the jumps spanning more than 2^8 in exp2 units."""
    case = make_case([4097, 300], 8, 16, mask="tree", seed=11)
    boost_prefix_keys(case, {5: 60.0, 1500: 80.0, 3000: 160.0, 4000: 320.0})
    ref, ref_lse = verify_attention_reference(*case.args(), return_lse=True)
    assert float(ref_lse[:8].max() - ref_lse[8:].max()) > 8  # the jumps dominate request 0
    out, lse = verify_attention(*case.args(chunk_size=64), return_lse=True)
    torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=3e-5, rtol=1e-5)


FP8 = torch.float8_e4m3fn


def test_fp8_op_passes_torch_opcheck():
    case = make_case([0, 9, 40], 4, 3, seed=1, kv_dtype=FP8, k_scale=0.5, v_scale=2.0)
    args = op_arguments(*case.args(chunk_size=16), fp8_numerics="triton", **case.scales())
    # test_schema compares inputs before and after with an arithmetic op that fp8 CPU tensors
    # lack; the fake-tensor and autograd-registration checks run.
    torch.library.opcheck(
        torch.ops.kdtree.verify_attention.default,
        args,
        test_utils=("test_faketensor", "test_autograd_registration"),
    )


def test_fp8_pool_is_stored_as_sglang_stores_it():
    """K / k_scale rounded to e4m3, V its first 512 columns, the draft tokens' slots included."""
    case = make_case([30, 7], 4, 2, seed=2, kv_dtype=FP8, k_scale=0.5, v_scale=2.0)
    assert case.k_buffer.dtype == FP8 and case.v_buffer.dtype == FP8
    assert case.v_buffer.data_ptr() == case.k_buffer.data_ptr()
    assert case.k_extend.dtype == torch.float32
    stored = case.k_buffer[case.out_cache_loc].float()
    torch.testing.assert_close(stored, (case.k_extend / 0.5).to(FP8).float(), rtol=0, atol=0)


@pytest.mark.parametrize("chunk_size", [1, 64, 4096])
@pytest.mark.parametrize("mask", ["tree", "chain", "causal"])
def test_fp8_cpu_op_equals_reference_on_dequantized_values(chunk_size, mask):
    """In float32 the specification's only departure from the reference is where the scales go
    (k_scale on the scores, v_scale on P, not on the stored operands): a float32 rounding."""
    case = make_case(
        [0, 1, 63, 65, 130], 5, 4, mask=mask, seed=4, kv_dtype=FP8, k_scale=0.75, v_scale=1.25
    )
    ref, ref_lse = verify_attention_reference(*case.args(), return_lse=True, **case.scales())
    out, lse = verify_attention(*case.args(chunk_size=chunk_size), return_lse=True, **case.scales())
    # (the dequantized values are ~1.7x the bf16 cases', and chunk 1 merges ~130 partials)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)


def test_fp8_scales_act_on_the_prefix_only():
    """Against a hand computation: prefix keys and values dequantized with their own scales, the
    draft tokens' bf16-path KV unscaled. Swapping the two scales changes the answer."""
    case = make_case([9], 3, 2, mask="causal", seed=6, kv_dtype=FP8, k_scale=0.5, v_scale=4.0)
    q = case.q.float()
    prefix = case.kv_indices.long()
    keys = torch.cat([case.k_buffer[prefix, 0].float() * 0.5, case.k_extend[:, 0]])
    values = torch.cat([case.v_buffer[prefix, 0].float() * 4.0, case.v_extend[:, 0]])
    scores = torch.einsum("nhd,kd->nhk", q, keys) * case.sm_scale
    visible = torch.ones(3, 12, dtype=torch.bool)
    visible[:, 9:] = torch.ones(3, 3, dtype=torch.bool).tril()
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    expected = torch.einsum("nhk,kd->nhd", scores.softmax(-1), values)
    out = verify_attention(*case.args(), **case.scales())
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    swapped = verify_attention(*case.args(), k_scale=4.0, v_scale=0.5)
    assert float((swapped - expected).abs().max()) > 0.5


def test_fp8_cpu_op_in_bf16_is_within_bf16_rounding_of_the_float32_reference():
    """The kernel's numerics with an fp8 pool: the dequantized values are exact in fp16 and bf16
    q rounds to fp16 exactly at these magnitudes, so the bound is the bf16 path's (P x v_scale
    rounded to fp16, the output to bf16)."""
    from kdtree_verify.testing import assert_close_bf16

    case = make_case(
        [0, 200, 37],
        8,
        8,
        mask="tree",
        dtype=torch.bfloat16,
        seed=5,
        kv_dtype=FP8,
        k_scale=0.8,
        v_scale=1.5,
    )
    ref = verify_attention_reference(*case.args(), **case.scales())
    out = verify_attention(*case.args(), **case.scales())
    assert out.dtype == torch.bfloat16
    assert_close_bf16(out, ref, "fp8 pool, bf16 CPU op")


def test_fp8_cpu_op_models_the_fp16_operands_q_saturates_at_65504():
    """With an fp8 pool the kernel's MMAs are fp16: a bf16 q component beyond fp16's range
    saturates to +-65504. So 2^20 and 2^17 give the same answer, which is not the float32
    reference's on the unsaturated q; q inside fp16's range is used exactly."""
    case = make_case([40, 3], 4, 4, mask="tree", dtype=torch.bfloat16, seed=9, kv_dtype=FP8)
    args = list(case.args())

    def spec_with(value: float) -> tuple[torch.Tensor, torch.Tensor]:
        q = case.q.clone()
        q[0, 0, 5], q[1, 2, 100] = value, -value
        args[1] = q
        return verify_attention(*args, return_lse=True, **case.scales())

    out_20, lse_20 = spec_with(2.0**20)
    out_17, lse_17 = spec_with(2.0**17)
    assert torch.equal(out_20, out_17) and torch.equal(lse_20, lse_17)
    unsaturated_lse = verify_attention_reference(*args, return_lse=True, **case.scales())[1]
    assert float((lse_17 - unsaturated_lse).abs().max()) > 1.0
    assert bool(torch.isfinite(out_20).all())
    lse_in_range = spec_with(2.0**12)[1]
    ref_lse = verify_attention_reference(*args, return_lse=True, **case.scales())[1]
    torch.testing.assert_close(lse_in_range, ref_lse, atol=0, rtol=1e-5)


# fp8_numerics="triton": the roundings of SGLang's Triton fp8 path. (SGLang's Triton kernel cannot
# be the oracle here: the interpreter's float8 casts flush e4m3 subnormals and saturate at 256, so
# the comparison with it runs on the GPU, tests/gpu/test_kernel.py.)
def test_round_e4m3_is_the_saturating_round_to_nearest_even_cast():
    from kdtree_verify.op import round_e4m3

    values = torch.tensor(
        [
            0.0,
            -0.0,
            1.0625,
            1.0626,
            1.1875,
            0.001,
            0.0009,
            2.0**-10,
            2.0**-9 * 1.5,
            0.0136,
            447.0,
            448.0,
            463.9,
            464.0,
            1e6,
            -1e6,
            float("inf"),
            float("-inf"),
        ]
    )
    rounded = round_e4m3(values)
    expected = torch.tensor(
        [
            0.0,
            -0.0,
            1.0,
            1.125,
            1.25,
            2.0**-9,
            0.0,
            0.0,
            2.0**-8,
            7 * 2.0**-9,
            448.0,
            448.0,
            448.0,
            448.0,
            448.0,
            -448.0,
            448.0,
            -448.0,
        ]
    )
    assert torch.equal(rounded, expected), (rounded - expected).abs().max()
    assert torch.isnan(round_e4m3(torch.tensor([float("nan")]))).all()
    # Every e4m3 value is kept, and anything else lands on the nearest one (ties to even).
    grid = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    finite = grid[torch.isfinite(grid)]
    assert torch.equal(round_e4m3(finite), finite)


@pytest.mark.parametrize("mask", ["tree", "causal"])
def test_triton_numerics_are_one_sequential_pass_for_any_split_size(mask):
    """Each split starts from the running max of every earlier split, so P is rounded against the
    same max whatever the split size: the merged result is the one-split result (to float32
    rounding), which is what lets the kernel split a prefix and still round as Triton does."""
    case = make_case(
        [0, 1, 63, 65, 300],
        6,
        4,
        mask=mask,
        dtype=torch.bfloat16,
        seed=8,
        kv_dtype=FP8,
        k_scale=0.75,
        v_scale=1.25,
    )
    whole = verify_attention(
        *case.args(chunk_size=4096), fp8_numerics="triton", return_lse=True, **case.scales()
    )
    for chunk_size in (1, 32, 64, 96):
        split = verify_attention(
            *case.args(chunk_size=chunk_size),
            fp8_numerics="triton",
            return_lse=True,
            **case.scales(),
        )
        torch.testing.assert_close(split[0], whole[0], atol=2**-8, rtol=2**-8)
        torch.testing.assert_close(split[1], whole[1], atol=1e-5, rtol=1e-6)


def test_triton_numerics_round_q_and_p_to_e4m3():
    """The triton mode is not the fp16 mode: with q far from the e4m3 grid it moves the answer by
    more than the fp16 mode's own distance to the reference, and it still stays near it."""
    from kdtree_verify.testing import assert_close_bf16

    case = make_case(
        [200, 37],
        8,
        8,
        mask="tree",
        dtype=torch.bfloat16,
        seed=5,
        kv_dtype=FP8,
        k_scale=0.8,
        v_scale=1.5,
    )
    ref = verify_attention_reference(*case.args(), **case.scales()).float()
    fp16 = verify_attention(*case.args(), **case.scales()).float()
    triton = verify_attention(*case.args(), fp8_numerics="triton", **case.scales()).float()
    assert_close_bf16(fp16, ref, "fp16 mode")
    assert float((triton - ref).norm()) > 4 * float((fp16 - ref).norm())
    assert float((triton - ref).norm() / ref.norm()) < 0.1
    # q already on the e4m3 grid: rounding q costs nothing, only P's rounding remains.
    on_grid = case.q.float().clamp(-448, 448).to(FP8).to(torch.bfloat16)
    args = (case.metadata(), on_grid, *case.layer()[1:])
    ref_grid = verify_attention_reference(*args, **case.scales()).float()
    triton_grid = verify_attention(*args, fp8_numerics="triton", **case.scales()).float()
    assert float((triton_grid - ref_grid).norm() / ref_grid.norm()) < 0.05


def test_fp8_numerics_must_be_a_known_mode():
    from kdtree_verify import VerifyInputError

    case = make_case([5], 2, 2, seed=1, kv_dtype=FP8)
    with pytest.raises(VerifyInputError, match="fp8_numerics"):
        verify_attention(*case.args(), fp8_numerics="e4m3", **case.scales())
