"""kdtree_bench.e2e.memory_plan: the table in docs/development.md is a fresh one, the weights it
counts match what SGLang loaded on the GPU, and the layout follows SGLang's sizing rule with
capped pools."""

from __future__ import annotations

import pytest

from kdtree_bench.e2e import memory_plan
from kdtree_bench.e2e.memory_plan import GIB, Row
from kdtree_bench.e2e.sglang_servers import kv_pool_cap, kv_tokens_needed


def test_the_committed_table_is_a_fresh_one() -> None:
    document = memory_plan.DOC.read_text()
    assert memory_plan.with_table(document, memory_plan.render()) == document, (
        "docs/development.md's memory plan is stale: python -m kdtree_bench.e2e.memory_plan --write"
    )


@pytest.mark.parametrize(
    ("spec", "loaded_gib"),
    # "Load weight end ... mem usage" of the 4-layer rank servers, e2e 25 (EAGLE: the target
    # 1.06, its NextN 0.56) and e2e 40 (DFlash: the target 1.06, the draft 0.63)
    [("eagle", 1.06 + 0.56), ("dflash", 1.06 + 0.63)],
)
def test_weights_match_what_the_servers_loaded(spec: str, loaded_gib: float) -> None:
    counted = memory_plan.weight_bytes(Row("rank", 4, spec, "bf16", 1, 1024)) / GIB
    assert counted == pytest.approx(loaded_gib, rel=0.1)


def test_kv_cells_match_the_pools_sglang_allocated() -> None:
    # e2e 25: 2,798,407 tokens in 12.01 GiB (4 MLA layers) + 3.00 GiB (the NextN layer), bf16;
    # e2e 36: 730,927 tokens in 2 x 4.88 GiB for the DFlash draft's K and V, fp8
    eagle = memory_plan.kv_bytes_per_token(Row("rank", 4, "eagle", "bf16", 1, 1024))
    assert eagle * 2_798_407 / GIB == pytest.approx(12.01 + 3.00, abs=0.02)
    dflash = memory_plan.kv_bytes_per_token(Row("rank", 4, "dflash", "fp8", 1, 1024))
    target_fp8 = 4 * 576
    assert (dflash - target_fp8) * 730_927 / GIB == pytest.approx(2 * 4.88, abs=0.02)


def test_the_capped_plan_matches_e2e_55s_servers() -> None:
    """Two 61-layer DDTree servers, budget 16, 1x32k and 128 new tokens, capped: SGLang logged
    37,026 tokens in 2.42 GiB (target) + 2 x 0.49 (draft); both together held 43.41 GiB, and both
    served at f 0.5 on the H100."""
    row = Row("rank", 61, "ddtree", "bf16", 1, 32768, new_tokens=128)
    assert kv_pool_cap(kv_tokens_needed(1, 32768, 128, row.width)) == 37_026
    p = memory_plan.plan(row)
    assert p.kv_gib == pytest.approx(2.42 + 2 * 0.49, abs=0.02)
    assert 2 * p.server_gib == pytest.approx(43.41, abs=0.05)
    layout = p.layout(memory_plan.FREE_AT_START_H100_GIB)
    assert layout.startswith("two servers, f ") and float(layout.rsplit(" ", 1)[1]) <= 0.5


def test_the_fraction_gives_the_last_server_its_cap_before_capture() -> None:
    """SGLang's pool before capture is min(cap, P x f - W); the second of two servers starts
    with P1 less all the first holds, so the chosen f (plus the margin) gives it its cap."""
    row = Row("rank", 61, "eagle", "bf16", 1, 1024)
    p = memory_plan.Plan(row, weights_gib=15.0, kv_gib=2.0, graphs_gib=3.0)
    layout = p.layout(80.0)
    assert layout == "two servers, f 0.31"  # 17 / (80 - 20) = 0.283, + 0.02, rounded up
    f = float(layout.rsplit(" ", 1)[1])
    assert (80.0 - p.server_gib) * f - p.weights_gib >= p.kv_gib
    # ... and is the smallest hundredth that does, past the margin
    assert (80.0 - p.server_gib) * (f - memory_plan.MARGIN - 0.01) - p.weights_gib < p.kv_gib


def test_layout_falls_back_to_one_server_per_mode_then_to_none() -> None:
    row = Row("rank", 61, "eagle", "bf16", 8, 32768)
    # Two would hold 96 GiB; one holds 48 and needs f >= 45 / 80.
    alone = memory_plan.Plan(row, weights_gib=15.0, kv_gib=30.0, graphs_gib=3.0)
    assert alone.layout(80.0) == "one server per mode, f 0.59"
    # 78 GiB leaves no room for the prefill's activations.
    assert memory_plan.Plan(row, 15.0, kv_gib=60.0, graphs_gib=3.0).layout(80.0) == "does not fit"


def test_eagles_graphs_are_bounded_by_the_room_that_was_too_small() -> None:
    bound = memory_plan.eagle_graphs_gib()
    weights = memory_plan.weight_bytes(Row("rank", 61, "eagle", "bf16", 8, 1024)) / GIB
    assert bound == pytest.approx(memory_plan.FREE_AT_START_GIB * 0.3 * 0.7 - weights)
    assert memory_plan.plan(Row("rank", 61, "eagle", "bf16", 1, 1024)).graphs_gib == bound
    dflash = memory_plan.plan(Row("rank", 61, "dflash", "bf16", 1, 1024))
    assert dflash.graphs_gib == memory_plan.DFLASH_DRAFT_GRAPHS_GIB


def test_servers_started_together_share_what_each_leaves_free() -> None:
    # Each takes half of what is free, then holds 1 GiB more once it runs.
    assert memory_plan.group_static_gib(100.0, 0.5, 3, overhead_gib=1.0) == [50.0, 24.5, 11.75]
    row = Row("rank", 4, "ddtree", "bf16", 1, 131072)
    weights = memory_plan.weight_bytes(row) / GIB
    fraction, room = memory_plan.group_fit(row, 4, memory_plan.FREE_AT_START_H100_GIB)
    assert room == pytest.approx(
        memory_plan.group_static_gib(memory_plan.FREE_AT_START_H100_GIB, fraction, 4)[-1] - weights
    )
    for other in (fraction - 0.01, fraction + 0.01):  # the best fraction of the hundredths
        shares = memory_plan.group_static_gib(memory_plan.FREE_AT_START_H100_GIB, other, 4)
        assert shares[-1] - weights <= room
