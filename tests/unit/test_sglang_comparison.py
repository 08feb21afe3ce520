"""The on-device comparison statistics and the shadow gate (CPU tensors; same code on CUDA)."""

import math

import torch

from kdtree_inference.sglang.comparison import ComparisonRecorder, ShadowGate


def recorder(**kwargs) -> ComparisonRecorder:
    return ComparisonRecorder(
        **{"num_layers": 3, "first_layer_id": 10, "device": "cpu", "atol": 0.1, "rtol": 0.5}
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
