"""The CUDA kernel's plan on the CPU: the workspace size formula, the row-tile bound and the split
cap (kdtree_verify/plan.py), and that its constants agree with csrc/verify_config.h."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from kdtree_verify import dims, plan

CONFIG = (Path(plan.__file__).resolve().parent.parent / "csrc" / "verify_config.h").read_text()


def _cpp_constant(name: str) -> int:
    match = re.search(rf"constexpr int {name} = (\d+);", CONFIG)
    assert match, f"{name} not found in verify_config.h"
    return int(match.group(1))


def test_constants_match_the_kernel_config() -> None:
    assert _cpp_constant("kBlockM") == plan.BLOCK_M
    assert _cpp_constant("kBlockN") == plan.BLOCK_N
    assert "kChunkMinTokens = 2 * kBlockN;" in CONFIG and plan.CHUNK_MIN_TOKENS == 2 * plan.BLOCK_N
    assert _cpp_constant("kMaxSplits") == plan.MAX_SPLITS
    assert _cpp_constant("kHeadDimV") == plan.V_DIM == dims.V_DIM == 512
    assert _cpp_constant("kHeadDimQK") == dims.QK_DIM == dims.V_DIM + dims.ROPE_DIM == 576


@pytest.mark.parametrize("seed", range(20))
def test_tile_slots_bound_any_split_of_tokens_into_requests(seed: int) -> None:
    rng = random.Random(seed)
    batch = rng.randint(1, 64)
    heads = rng.choice([1, 8, 12, 16, 128])
    counts = [rng.choice([0, 1, 2, 5, 13, 33, 64]) for _ in range(batch)]
    total = sum(counts)
    needed = sum(math.ceil(n * heads / plan.BLOCK_M) for n in counts)
    assert needed <= plan.num_tile_slots(batch, heads, total)


def test_tile_slots_is_tight_for_uniform_batches() -> None:
    # 1 request x 8 tokens x 8 heads = 64 rows = 2 tiles; the bound allows one spare slot.
    assert plan.num_tile_slots(1, 8, 8) == 3
    assert plan.num_tile_slots(4, 128, 128) == 4 * 32 * 128 // 32 + 4


def test_workspace_layout_formula() -> None:
    layout = plan.workspace_layout(slots=10, max_splits=4)
    offsets = layout.offsets()
    assert offsets == sorted(offsets) and all(o % plan.ALIGN == 0 for o in offsets)
    partial_rows = 4 * 10 * plan.BLOCK_M
    assert layout.chunk - layout.tiles >= 48 * 10
    assert layout.o_part - layout.lse_part >= 4 * partial_rows
    assert layout.row_max - layout.o_part == 4 * 512 * partial_rows  # 256-aligned already
    assert layout.total_bytes - layout.row_max == 4 * partial_rows
    assert layout.total_bytes % plan.ALIGN == 0


def test_single_split_needs_no_partial_buffers() -> None:
    layout = plan.workspace_layout(slots=4096, max_splits=1)
    assert layout.total_bytes == layout.row_max == layout.o_part == layout.lse_part + 0
    assert layout.chunk == plan.TILE_META_BYTES * 4096  # the tile table, then the chunk word
    assert layout.total_bytes == layout.chunk + plan.ALIGN


def test_workspace_layout_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="max_splits"):
        plan.workspace_layout(1, plan.MAX_SPLITS + 1)
    with pytest.raises(ValueError, match="slots"):
        plan.workspace_layout(0, 1)


def test_make_plan_rejects_bad_static_sizes() -> None:
    for sizes in [(0, 8, 8), (1, 0, 8), (1, 8, -1)]:
        with pytest.raises(ValueError, match="make_plan: need batch_size >= 1"):
            plan.make_plan(*sizes, "cpu", target_ctas=132, max_splits=1)


def test_max_splits_fills_the_machine_then_drops_to_one() -> None:
    # B=1, H=8, T=8: 2 row tiles, so up to 2 x 132 / 2 = 132 -> capped at MAX_SPLITS.
    assert plan.choose_max_splits(8, 8, target_ctas=132) == plan.MAX_SPLITS
    assert plan.choose_max_splits(16, 16, target_ctas=132) == 33
    # H=128 x 32 tokens x 32 requests = 4096 row tiles: no splitting, no combine.
    assert plan.choose_max_splits(128, 32 * 32, target_ctas=132) == 1


def _ctas(requests: list[tuple[int, int]], heads: int, chunk: int) -> int:
    return sum(
        math.ceil(n * heads / plan.BLOCK_M) * math.ceil((p + n) / chunk) for n, p in requests if n
    )


def _work_chunk(requests: list[tuple[int, int]], heads: int, target: int, cap: int) -> int:
    """The split size before the one-wave step: work / target, the split cap, 64; rounded to 32."""
    live = [(math.ceil(n * heads / plan.BLOCK_M), p + n) for n, p in requests if n]
    work = sum(t * length for t, length in live)
    chunk = max(-(-work // target), -(-max(length for _, length in live) // cap), 64)
    return -(-chunk // 32) * 32


def test_split_chunk_ends_the_second_wave_of_draft_only_splits() -> None:
    # B=8, H=8, T=8, 4k: 16 row tiles. Work / 132 CTAs gives 512-token splits, 9 per request
    # because of the 8 draft tokens, so 144 CTAs for 132 SMs. 544 gives 8 splits, 128 CTAs.
    requests = [(8, 4096)] * 8
    assert _work_chunk(requests, 8, 132, 17) == 512 and _ctas(requests, 8, 512) == 144
    chunk = plan.split_chunk(requests, 8, target_ctas=132, max_splits=17)
    assert chunk == 544 and _ctas(requests, 8, chunk) == 128
    # B=1, H=128, T=32, 4k: 128 row tiles, 2 splits (4032 + 96 tokens) -> one split each.
    assert plan.split_chunk([(32, 4096)], 128, target_ctas=132, max_splits=3) == 4128


@pytest.mark.parametrize("seed", range(40))
def test_split_chunk_is_the_smallest_one_wave_size(seed: int) -> None:
    rng = random.Random(seed)
    heads = rng.choice([8, 12, 16, 128])
    requests = [
        (rng.choice([0, 1, 2, 5, 8, 16, 32]), rng.choice([0, 1, 63, 1000, 4096, 32768, 131072]))
        for _ in range(rng.randint(1, 40))
    ]
    target = rng.choice([132, 188, 170])
    total = sum(n for n, _ in requests)
    cap = plan.choose_max_splits(heads, total, target)
    chunk = plan.split_chunk(requests, heads, target, cap)
    assert chunk % 32 == 0 and chunk >= 64
    if not any(n for n, _ in requests):
        assert chunk == 64
        return
    start = _work_chunk(requests, heads, target, cap)
    assert chunk >= start
    assert max(math.ceil((p + n) / chunk) for n, p in requests if n) <= cap
    tiles = sum(math.ceil(n * heads / plan.BLOCK_M) for n, _ in requests)
    if tiles > target:
        assert chunk == start  # more row tiles than CTAs in a wave: splitting less cannot help
    else:
        assert _ctas(requests, heads, chunk) <= target
        if chunk > start:  # one step smaller would overflow the wave
            assert _ctas(requests, heads, chunk - 32) > target


def test_split_chunk_of_a_batch_without_draft_tokens() -> None:
    assert plan.split_chunk([(0, 100), (0, 5)], 16, target_ctas=132, max_splits=4) == 64
