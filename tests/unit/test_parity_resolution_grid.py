"""bench/kdtree_bench/e2e/parity_resolution.py's grid: which candidates run, in which order, with which floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdtree_bench.e2e import parity_resolution

ROOT = Path(__file__).resolve().parents[2]


def test_controls_and_the_floor_come_first_then_the_faults_in_order() -> None:
    floor = parity_resolution.kv_splits_floor(3)
    grid = parity_resolution.candidates(["tree_mask:3", "scale:0.01"], floor)
    assert [c.name for c in grid] == [
        "identical",
        "equivalent_numerics",
        "kv_splits_3",
        "tree_mask:3",
        "scale:0.01",
    ]
    assert grid[2].options == {"attention_kv_splits": 3} and grid[2].kind is None
    assert (grid[3].kind, grid[3].size, grid[4].kind, grid[4].size) == (
        "tree_mask",
        3,
        "scale",
        0.01,
    )


def test_a_fault_only_grid_leaves_every_candidate_that_must_pass_out() -> None:
    grid = parity_resolution.candidates(
        ["kv_drop:16"], parity_resolution.CHAIN_FLOOR, controls=False
    )
    assert [(c.name, c.kind) for c in grid] == [("kv_drop:16", "kv_drop")]


def test_a_malformed_fault_is_refused_before_any_server_starts() -> None:
    with pytest.raises(ValueError):
        parity_resolution.candidates(["scale:"], controls=False)


def test_a_one_layer_output_scale_is_a_server_option_of_its_own() -> None:
    (cand,) = parity_resolution.candidates(["layer_scale:1:0.02"], controls=False)
    assert (cand.kind, cand.size) == ("layer_scale", 0.02)
    assert cand.options == {"fault_layer": 1, "fault_scale": 1.02}
    assert cand.env[parity_resolution.ENV_VAR] == ""  # no injected fault besides it
    for bad in ("layer_scale:1", "layer_scale:x:0.02", "layer_scale:1:1.5"):
        with pytest.raises(ValueError, match="layer_scale:LAYER:SIZE"):
            parity_resolution.candidates([bad], controls=False)
