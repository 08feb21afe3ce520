"""The on-device comparison statistics and the shadow gate (CPU tensors; same code on CUDA)."""

import math

import pytest
import torch

from kdtree_inference.sglang.comparison import ComparisonRecorder, ShadowGate, VerifyComparison


def recorder(**kwargs) -> ComparisonRecorder:
    # value_dim 1: one scale per layer, and any output shape is a whole number of rows.
    return ComparisonRecorder(
        **{
            "num_layers": 3,
            "first_layer_id": 10,
            "device": "cpu",
            "atol": 0.1,
            "rtol": 0.5,
            "value_dim": 1,
        }
        | kwargs
    )


def test_statistics_follow_their_definitions():
    rec = recorder()
    triton = torch.tensor([[1.0, -2.0], [0.0, 4.0]])
    kernel = torch.tensor([[1.05, -2.0], [0.3, 7.0]])
    rec.record(11, kernel, triton)
    rec.snapshot()
    (stats,) = rec.collect()
    assert stats.layer_id == 11 and stats.compared == 4
    assert math.isclose(stats.max_abs, 3.0, rel_tol=1e-6)
    # max |d| / (|ref| + atol): 0.05/1.1, 0, 0.3/0.1, 3/4.1 -> 3.0
    assert math.isclose(stats.max_rel, 3.0, rel_tol=1e-5)
    # over when |d| > atol + rtol|ref|: 0.05 <= 0.6 no; 0.3 > 0.1 yes; 3 > 2.1 yes
    assert stats.over_tolerance == 2


def test_windows_accumulate_then_reset():
    rec = recorder()
    ref = torch.zeros(5)
    rec.record(10, ref + 0.2, ref)
    rec.record(10, ref + 0.05, ref)
    rec.record(12, ref, ref)
    rec.snapshot()
    stats = {s.layer_id: s for s in rec.collect()}
    assert set(stats) == {10, 12}
    assert math.isclose(stats[10].max_abs, 0.2, rel_tol=1e-6) and stats[10].compared == 10
    assert stats[10].over_tolerance == 5 and stats[12].over_tolerance == 0
    assert rec.collect() is None  # nothing pending until the next snapshot
    rec.snapshot()
    assert rec.collect() == []  # the window was reset: nothing compared since


def test_nan_is_over_tolerance_and_kept_as_the_maximum():
    rec = recorder()
    rec.record(10, torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]))
    rec.record(10, torch.tensor([5.0]), torch.tensor([0.0]))
    rec.snapshot()
    (stats,) = rec.collect()
    assert math.isnan(stats.max_abs) and stats.over_tolerance == 2


def test_closed_gate_records_nothing_even_against_garbage():
    rec = recorder()
    garbage = torch.tensor([float("inf"), float("nan"), 1e30])
    rec.record(10, torch.zeros(3), garbage, gate=torch.tensor(False))
    rec.record(11, torch.ones(3), torch.zeros(3), gate=torch.tensor(True))
    rec.snapshot()
    (stats,) = rec.collect()
    assert stats.layer_id == 11 and stats.compared == 3 and stats.max_abs == 1.0


def test_layers_outside_the_pool_are_refused():
    rec = recorder()
    try:
        rec.record(13, torch.zeros(1), torch.zeros(1))
    except IndexError as error:
        assert "[10, 13)" in str(error)
    else:
        raise AssertionError("layer 13 is outside layers 10..12")


def test_shadow_gate_copies_or_zeroes_the_metadata():
    gate = ShadowGate(max_batch_size=4, device=torch.device("cpu"))
    qo = torch.tensor([0, 3, 6], dtype=torch.int32)
    kv = torch.tensor([0, 5, 22], dtype=torch.int32)
    gate.set(True, qo, kv)
    assert bool(gate.open)
    assert gate.qo_indptr.tolist() == [0, 3, 6, 0, 0] and gate.kv_indptr[:3].tolist() == [0, 5, 22]
    gate.set(False, qo, kv)
    assert not bool(gate.open)
    assert gate.qo_indptr.abs().sum() == 0 and gate.kv_indptr.abs().sum() == 0


# ---------------------------------------------------------------- the value-scaled floor
# A recorder at the bf16 pool's tolerance over 4 latent dimensions, 2 heads per token: outputs
# are [tokens, 2 * 4], so element j is latent dimension j % 4.
DIMS = 4


def scaled_recorder(**kwargs) -> ComparisonRecorder:
    return recorder(atol=0.02, rtol=0.02, value_dim=DIMS, **kwargs)


def pool_values(*per_dim: float, rows: int = 6) -> torch.Tensor:
    """A [rows, 1, DIMS] bf16 value buffer whose largest |value| in dimension d is per_dim[d],
    signs mixed, the largest in the middle row."""
    values = torch.zeros(rows, 1, DIMS)
    for dim, largest in enumerate(per_dim):
        values[:, 0, dim] = torch.linspace(-largest / 2, largest / 4, rows)
        values[rows // 2, 0, dim] = -largest if dim % 2 else largest
    return values.to(torch.bfloat16)


def outputs_differing_in(dim: int, by: float = 0.03, tokens: int = 3):
    """(kernel, triton) [tokens, 2 * DIMS]: |triton| < 0.5 everywhere, kernel off by ``by`` in
    latent dimension ``dim`` of both heads (2 * tokens elements)."""
    triton = torch.full((tokens, 2 * DIMS), 0.25)
    kernel = triton.clone()
    kernel.view(tokens, 2, DIMS)[:, :, dim] += by
    return kernel, triton


def over_and_compared(rec: ComparisonRecorder) -> tuple[int, int]:
    rec.snapshot()
    (stats,) = rec.collect()
    return stats.over_tolerance, stats.compared


def test_large_values_widen_only_their_own_dimension():
    rec = scaled_recorder()
    rec.refresh_value_scale(11, pool_values(1.0, 6.0, 0.5, 1.0))
    assert rec.value_scale[1].tolist() == [1.0, 6.0, 0.5, 1.0]
    # dimension 1 (|v| <= 6): floor 0.02 * 6 + 0.02 * 0.25 = 0.125 > 0.03: within tolerance.
    rec.record(11, *outputs_differing_in(1))
    assert over_and_compared(rec) == (0, 3 * 2 * DIMS)
    # dimensions 0 and 2 (|v| <= 1): floor 0.02 + 0.005 < 0.03: over, both heads of 3 tokens.
    rec.record(11, *outputs_differing_in(0))
    rec.record(11, *outputs_differing_in(2))
    assert over_and_compared(rec) == (2 * 6, 2 * 3 * 2 * DIMS)


def test_max_rel_is_over_the_scaled_floor():
    rec = scaled_recorder()
    rec.refresh_value_scale(11, pool_values(1.0, 6.0, 0.5, 1.0))
    rec.record(11, *outputs_differing_in(1))
    rec.snapshot()
    (stats,) = rec.collect()
    assert math.isclose(stats.max_rel, 0.03 / (0.25 + 0.02 * 6), rel_tol=1e-5)


def test_without_a_refresh_the_floor_is_the_plain_atol():
    rec = scaled_recorder()
    # the same 0.03 off in every dimension, in one call and then one dimension per call
    triton = torch.full((3, 2 * DIMS), 0.25)
    rec.record(11, triton + 0.03, triton)
    assert over_and_compared(rec) == (3 * 2 * DIMS, 3 * 2 * DIMS)
    rec.record(11, *outputs_differing_in(1))
    # 0.02 + 0.02 * 0.25 = 0.025 < 0.03 over; 0.02 <= 0.025 within
    rec.record(11, *outputs_differing_in(3, by=0.02))
    assert over_and_compared(rec) == (6, 2 * 3 * 2 * DIMS)
    assert rec.value_scale.abs().sum() == 0


def test_new_values_widen_only_the_dimensions_they_exceed():
    rec = scaled_recorder()
    rec.refresh_value_scale(11, pool_values(1.0, 1.0, 1.0, 1.0))
    new = torch.tensor([[0.5, 0.0, -6.0, 0.25], [0.0, 2.0, 1.0, 0.0]], dtype=torch.bfloat16)
    for dim in range(DIMS):
        rec.record(11, *outputs_differing_in(dim), new_values=new.view(2, 1, DIMS))
    # dimension 2 (new |v| 6): within; dimension 1 (2: floor 0.045): within; 0 and 3: over.
    assert over_and_compared(rec) == (2 * 6, DIMS * 3 * 2 * DIMS)
    # the new rows are not the pool: the next call without them is back to the pool's scale
    assert rec.value_scale[1].tolist() == [1.0, 1.0, 1.0, 1.0]
    rec.record(11, *outputs_differing_in(2))
    assert over_and_compared(rec) == (6, 3 * 2 * DIMS)


def test_a_float8_pool_scales_like_its_dequantized_values():
    values = pool_values(1.0, 6.0, 0.5, 448.0, rows=9)
    values[1, 0, 2] = -0.0  # negative zero: a code with the sign bit only
    fp8 = values.float().to(torch.float8_e4m3fn)
    rec, reference = scaled_recorder(), scaled_recorder()
    rec.refresh_value_scale(12, fp8, v_scale=2.0)
    reference.refresh_value_scale(12, fp8.float(), v_scale=2.0)
    assert rec.value_scale[2].tolist() == reference.value_scale[2].tolist()
    assert rec.value_scale[2].tolist() == [2.0, 12.0, 1.0, 896.0]


def test_a_float8_pool_larger_than_one_scan_step(monkeypatch):
    monkeypatch.setattr("kdtree_inference.sglang.comparison._FP8_SCAN_BYTES", 3 * DIMS)
    values = torch.zeros(10, 1, DIMS)
    values[7, 0] = torch.tensor([-3.0, 0.5, 2.0, -0.25])  # in the third of four steps
    values[9, 0, 0] = 1.0  # in the last, partial step
    rec = scaled_recorder()
    rec.refresh_value_scale(10, values.to(torch.float8_e4m3fn))
    assert rec.value_scale[0].tolist() == [3.0, 0.5, 2.0, 0.25]


def test_non_finite_pool_values_leave_the_plain_atol():
    values = pool_values(6.0, 6.0, 6.0, 6.0)
    values[0, 0, 0] = float("nan")
    values[0, 0, 1] = float("-inf")
    rec = scaled_recorder()
    rec.refresh_value_scale(10, values)
    assert rec.value_scale[0].tolist() == [0.0, 0.0, 6.0, 6.0]
    fp8 = pool_values(6.0, 6.0, 6.0, 6.0).float().to(torch.float8_e4m3fn)
    fp8.view(torch.uint8)[0, 0, 3] = 0xFF  # e4m3fn's negative NaN
    rec.refresh_value_scale(10, fp8)
    assert rec.value_scale[0].tolist() == [6.0, 6.0, 6.0, 0.0]


def test_nan_output_is_over_tolerance_at_any_scale():
    rec = scaled_recorder()
    rec.refresh_value_scale(11, pool_values(100.0, 100.0, 100.0, 100.0))
    triton = torch.full((2, 2 * DIMS), 0.25)
    kernel = triton.clone()
    kernel[0, 1] = float("nan")
    kernel[1, 6] = float("nan")
    rec.record(11, kernel, triton, new_values=torch.full((2, DIMS), 50.0))
    rec.snapshot()
    (stats,) = rec.collect()
    assert stats.over_tolerance == 2 and stats.compared == 2 * 2 * DIMS
    assert math.isnan(stats.max_abs) and math.isnan(stats.max_rel)


def test_closed_gate_records_nothing_with_a_scale_and_new_values():
    rec = scaled_recorder()
    rec.refresh_value_scale(11, pool_values(1.0, 1.0, 1.0, 1.0))
    new = torch.ones(3, DIMS)
    kernel, triton = outputs_differing_in(0, by=5.0)
    rec.record(11, kernel, triton, gate=torch.tensor(False), new_values=new)
    rec.record(12, kernel, triton, gate=torch.tensor(True), new_values=new)
    rec.snapshot()
    (stats,) = rec.collect()
    assert stats.layer_id == 12 and stats.over_tolerance == 6 and stats.compared == 3 * 2 * DIMS


def test_refresh_writes_the_scale_in_place():
    rec = scaled_recorder()
    storage, row = rec.value_scale.data_ptr(), rec.value_scale[2]
    rec.refresh_value_scale(12, pool_values(1.0, 2.0, 3.0, 4.0))
    rec.refresh_value_scale(12, pool_values(4.0, 3.0, 2.0, 1.0))
    assert rec.value_scale.data_ptr() == storage
    assert row.tolist() == [4.0, 3.0, 2.0, 1.0]  # a view taken before sees the refresh
    assert rec.value_scale[:2].abs().sum() == 0


def test_outputs_must_be_whole_rows_of_the_value_width():
    rec = scaled_recorder()
    with pytest.raises(ValueError, match="multiple of the value width 4"):
        rec.record(10, torch.zeros(2, 6), torch.zeros(2, 6))
    with pytest.raises(ValueError, match="value width 4"):
        rec.refresh_value_scale(10, torch.zeros(5, 1, 3))


def test_verify_comparison_refreshes_every_recorder_and_layer():
    comparison = VerifyComparison(
        telemetry=None,
        num_layers=2,
        first_layer_id=5,
        device=torch.device("cpu"),
        atol=0.02,
        rtol=0.02,
        value_dim=DIMS,
        validate_every=1,
        vs_exact=True,
    )
    buffers = {5: pool_values(1.0, 2.0, 3.0, 4.0), 6: pool_values(8.0, 8.0, 8.0, 8.0)}
    read = []

    def value_buffer(layer_id: int) -> torch.Tensor:
        read.append(layer_id)
        return buffers[layer_id]

    # layer 6's read scale is not known: not read, its scale kept
    comparison.refresh_value_scales(value_buffer, {5: 0.5}.get)
    assert read == [5]
    recorders = [comparison.recorder, *comparison.exact_recorders.values()]
    assert len(recorders) == 3
    for rec in recorders:
        assert rec.value_scale.tolist() == [[0.5, 1.0, 1.5, 2.0], [0.0] * DIMS]
    comparison.refresh_value_scales(value_buffer, lambda layer_id: 1.0)
    for rec in recorders:
        assert rec.value_scale.tolist() == [[1.0, 2.0, 3.0, 4.0], [8.0] * DIMS]
