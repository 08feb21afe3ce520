"""kdtree_bench.e2e.memory_plan: the table in docs/development.md is a fresh one, the weights it
counts match what SGLang loaded on the GPU, and the layout follows SGLang's sizing rule."""

from __future__ import annotations

import pytest

from kdtree_bench.e2e import memory_plan
from kdtree_bench.e2e.memory_plan import GIB, Row


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


def test_layout_follows_the_second_servers_room() -> None:
    row = Row("rank", 61, "eagle", "bf16", 1, 1024)
    weights = memory_plan.weight_bytes(row) / GIB
    room = memory_plan.second_room_gib(weights, memory_plan.TWO_SERVERS_FRACTION)
    assert memory_plan.Plan(row, weights, kv_gib=0.5, reserve_gib=room - 1).layout == (
        f"two servers, f {memory_plan.TWO_SERVERS_FRACTION}"
    )
    wider = memory_plan.second_room_gib(weights, 0.5)
    assert memory_plan.Plan(row, weights, kv_gib=wider - room, reserve_gib=room).layout == (
        "two servers, f 0.5"
    )
    alone = memory_plan.Plan(row, weights, kv_gib=40.0, reserve_gib=10.0)
    assert alone.layout.startswith("one server per mode, f ")
    fraction = float(alone.layout.rsplit(" ", 1)[1])
    assert memory_plan.FREE_AT_START_GIB * fraction - weights >= 50.0
    assert memory_plan.Plan(row, weights, kv_gib=200.0, reserve_gib=0).layout == (
        "does not fit one H200"
    )


def test_the_reserve_is_the_room_that_was_too_small() -> None:
    reserve = memory_plan.reserve_gib()
    weights = memory_plan.weight_bytes(Row("rank", 61, "eagle", "bf16", 8, 1024)) / GIB
    assert reserve == pytest.approx(memory_plan.FREE_AT_START_GIB * 0.3 * 0.7 - weights)


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
