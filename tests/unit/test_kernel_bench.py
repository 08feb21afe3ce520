"""bench/kdtree_bench/kernel/kernel_bench.py's pure parts: grid partitioning, shape lists, merging part results into
one complete grid, and the efficiency against the mma.sync ceiling; output_bits.py's comparison."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from kdtree_bench.kernel import cases, kernel_bench, output_bits


def _record(shape: tuple[int, int, int, int]) -> dict:
    B, H, T, P = shape
    return {
        "B": B,
        "H": H,
        "T": T,
        "prefix": P,
        "kdtree_us": 10.0,
        "ideal_us": 20.0,
        "roofline_efficiency": 0.5,
    }


def _part(path: Path, shapes, complete: bool = True) -> str:
    result = {
        "ceilings": {"copy_TBps": 4.2, "matmul_TFLOPs": 800.0},
        "complete": complete,
        "records": [_record(s) for s in shapes],
    }
    path.write_text(json.dumps(result))
    return str(path)


def test_parts_partition_the_grid() -> None:
    grid = kernel_bench.grid_shapes()
    assert len(grid) == 81
    parts = [grid[k - 1 :: 4] for k in range(1, 5)]
    assert sorted(s for p in parts for s in p) == sorted(grid)
    assert kernel_bench.parse_part("2/4") == (2, 4)
    for bad in ("0/2", "3/2", "x", "1-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            kernel_bench.parse_part(bad)


def test_the_command_line_selects_the_shapes() -> None:
    """--shapes wins; else fp8's list, the quick list or the grid, cut by --part K/N."""

    def shapes(*argv: str) -> list:
        return kernel_bench.selected_shapes(kernel_bench.build_parser().parse_args(list(argv)))

    grid = kernel_bench.grid_shapes()
    assert shapes() == grid
    assert shapes("--part", "2/3") == grid[1::3]
    assert shapes("--quick") == kernel_bench.QUICK_SHAPES
    assert shapes("--quick", "--kv-dtype", "fp8") == kernel_bench.FP8_SHAPES
    assert shapes("--kv-dtype", "fp8", "--part", "1/2") == kernel_bench.FP8_SHAPES[::2]
    given = "1x8x8x200000,8x16x16x4096"
    assert shapes("--shapes", given, "--part", "2/2", "--kv-dtype", "fp8") == [
        (1, 8, 8, 200000),
        (8, 16, 16, 4096),
    ]
    args = kernel_bench.build_parser().parse_args([])
    assert (args.out, args.l2, args.kv_dtype, args.target_ctas) == (
        "bench/results/h200.json",
        "flushed",
        "bf16",
        None,
    )


def test_the_merge_needs_no_gpu(tmp_path) -> None:
    grid = kernel_bench.grid_shapes()
    first = _part(tmp_path / "a.json", grid[0::2])
    second = _part(tmp_path / "b.json", grid[1::2])
    out = tmp_path / "m.json"
    assert kernel_bench.main(["--merge", first, second, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["complete"] is True


def test_shape_lists_parse_and_refuse_garbage() -> None:
    assert kernel_bench.parse_shapes("1x8x8x32768,8x16x16x4096") == [
        (1, 8, 8, 32768),
        (8, 16, 16, 4096),
    ]
    for bad in ("1x8x8", "1x8x8x0", "axbxcxd", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            kernel_bench.parse_shapes(bad)


def test_target_ctas_takes_positive_integers_only() -> None:
    assert kernel_bench.positive_int("66") == 66
    for bad in ("0", "-4", "1.5", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            kernel_bench.positive_int(bad)


def test_merge_orders_records_and_marks_a_covered_grid_complete(tmp_path: Path) -> None:
    grid = kernel_bench.grid_shapes()
    first = _part(tmp_path / "a.json", list(reversed(grid[:40])), complete=False)
    second = _part(tmp_path / "b.json", grid[40:])
    merged = json.loads(
        kernel_bench.merge_parts([first, second], str(tmp_path / "m.json")).read_text()
    )
    assert [(r["B"], r["H"], r["T"], r["prefix"]) for r in merged["records"]] == grid
    assert merged["complete"] is True
    assert [p["complete"] for p in merged["parts"]] == [False, True]
    assert merged["summary"]["efficiency_median_ideal_ge_10us"] == 0.5


def test_merge_is_incomplete_with_gaps_or_duplicates(tmp_path: Path) -> None:
    grid = kernel_bench.grid_shapes()
    gap = kernel_bench.merge_parts([_part(tmp_path / "a.json", grid[1:])], str(tmp_path / "g.json"))
    assert json.loads(gap.read_text())["complete"] is False
    dup = kernel_bench.merge_parts(
        [_part(tmp_path / "b.json", grid), _part(tmp_path / "c.json", grid[:1])],
        str(tmp_path / "d.json"),
    )
    assert json.loads(dup.read_text())["complete"] is False


def test_mma_sync_efficiency_uses_the_slower_roof() -> None:
    ceilings = {"copy_TBps": 4.0, "mma_sync_TFLOPs": 500.0}
    # compute-bound: 1 TFLOP at 500 TF/s = 2000 us ideal, measured 4000 us
    assert kernel_bench.mma_sync_efficiency(1e6, 1e12, 4000.0, ceilings) == 0.5
    # memory-bound: 4 GB at 4 TB/s = 1000 us ideal, measured 2000 us
    assert kernel_bench.mma_sync_efficiency(4e9, 1e9, 2000.0, ceilings) == 0.5
    assert kernel_bench.mma_sync_efficiency(4e9, 1e9, 2000.0, {"copy_TBps": 4.0}) is None


def test_merge_refuses_parts_timed_with_different_l2_states(tmp_path: Path) -> None:
    grid = kernel_bench.grid_shapes()
    flushed, warm = _part(tmp_path / "f.json", grid[:40]), _part(tmp_path / "w.json", grid[40:])
    for path, l2 in [(flushed, "flushed"), (warm, "warm")]:
        data = json.loads(Path(path).read_text())
        data["timing"] = kernel_bench.timing_note(l2)
        Path(path).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="timed differently"):
        kernel_bench.merge_parts([flushed, warm], str(tmp_path / "m.json"))


def test_l2_states_are_described_and_checked() -> None:
    assert set(kernel_bench.L2_STATES) == {"flushed", "clean", "warm"}
    assert "256 MiB zeroed" in kernel_bench.timing_note("flushed")
    assert "no flush" in kernel_bench.timing_note("warm")
    with pytest.raises(ValueError, match="l2: one of flushed, clean, warm"):
        kernel_bench.Timer(l2="hot")  # refused before any CUDA allocation


def test_output_bits_tells_a_one_bit_change_from_identical_outputs(capsys) -> None:
    """bench/kdtree_bench/kernel/output_bits.py's comparison: bit for bit, NaNs included."""
    out = torch.tensor([[1.0, -2.5, float("nan")]], dtype=torch.bfloat16)
    lse = torch.tensor([0.25, 3.0])
    saved = {"a fp16": (out, lse), "a triton": (out, lse)}
    assert (
        output_bits.compare(saved, {k: (o.clone(), s.clone()) for k, (o, s) in saved.items()}) == 0
    )
    assert "2 of 2 identical" in capsys.readouterr().out

    nudged = lse.clone()
    nudged[1] = torch.nextafter(nudged[1], torch.tensor(4.0))  # one ULP
    assert output_bits.compare(saved, {"a fp16": (out, lse), "a triton": (out, nudged)}) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("identical  a fp16") and lines[1].startswith("DIFFERENT  a triton")
    assert output_bits.compare(saved, {"a fp16": (out, lse)}) == 2


def test_output_bits_names_every_case_and_numerics_apart() -> None:
    """Results are keyed by name: two cases of one name would hide one from the comparison."""
    names = [
        f"{output_bits.case_name(*spec)} {numerics}"
        for spec in output_bits.CASES
        for numerics in cases.numerics_modes(spec)
    ]
    assert len(set(names)) == len(names)
    assert len(names) == len(output_bits.CASES) + sum(map(cases.is_fp8, output_bits.CASES))
