"""bench/kdtree_bench/analysis/compare_runs.py and bench/kdtree_bench/profiling/stall_phases.py: comparing result files shape by shape, and
splitting Nsight Compute's per-instruction samples into main-loop phases or explicit regions
(both run on committed files, no GPU)."""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path

import pytest

from kdtree_bench.analysis import compare_runs
from kdtree_bench.profiling import stall_phases

DATA = Path(__file__).resolve().parent / "data"


def _run(path: Path, times: dict[tuple[int, int, int, int], float]) -> Path:
    records = [
        {"B": b, "H": h, "T": t, "prefix": p, "kdtree_us": us} for (b, h, t, p), us in times.items()
    ]
    path.write_text(json.dumps({"ceilings": {}, "summary": {}, "records": records}))
    return path


def test_compare_runs_ratios_and_geomean(tmp_path: Path) -> None:
    base = _run(tmp_path / "base.json", {(1, 8, 8, 4096): 10.0, (1, 8, 8, 32768): 40.0})
    other = _run(
        tmp_path / "other.json",
        {(1, 8, 8, 4096): 5.0, (1, 8, 8, 32768): 80.0, (8, 8, 8, 4096): 1.0},
    )
    text = compare_runs.compare([base, other])
    assert "5.0 (0.50)" in text and "80.0 (2.00)" in text
    assert "other: time / base geomean 1.000 (best 0.50, worst 2.00)" in text
    assert "8   8   8" not in text  # only shapes present in every run


def test_compare_runs_refuses_disjoint_runs(tmp_path: Path) -> None:
    a = _run(tmp_path / "a.json", {(1, 8, 8, 4096): 1.0})
    b = _run(tmp_path / "b.json", {(8, 8, 8, 4096): 1.0})
    with pytest.raises(SystemExit, match="share no grid shape"):
        compare_runs.compare([a, b])


STALLS = ["stall_wait", "stall_short_sb"]


def _sass_csv(path: Path, instrs: list[tuple[str, int, int, int]]) -> Path:
    """(sass, executed, wait samples, short_sb samples) per instruction, in ncu's CSV layout."""
    header = ["Address", "Source", "# Samples", "Instructions Executed", *STALLS]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "attention_kernel"])
        w.writerow(header)
        for i, (sass, executed, wait, short) in enumerate(instrs):
            w.writerow([hex(i * 16), sass, wait + short, executed, wait, short])
    return path


LOOP = [
    ("LDC R1, c[0x0][0x28]", 1, 1, 0),  # prologue
    ("BAR.SYNC 0x0", 100, 2, 0),  # loop top
    ("HMMA.16816.F32.BF16 R8, R4, R2, R8", 100, 10, 0),
    ("STS.128 [R1], R8", 100, 0, 3),
    ("@P0 LDS R2, [R3]", 7, 0, 1),  # a rare path inside the reduce phase
    ("MUFU.EX2 R5, R6", 100, 1, 0),
    ("LDSM.16.MT88.4 R4, [R2]", 100, 0, 4),
    ("@!P4 BRA 0x10", 100, 1, 0),
    ("EXIT", 1, 0, 0),  # epilogue
]


def test_stall_phases_split_at_the_landmarks(tmp_path: Path) -> None:
    instrs = stall_phases.read_instructions(_sass_csv(tmp_path / "k.csv", LOOP))
    bounds = {name: (lo, hi) for name, lo, hi in stall_phases.phase_bounds(instrs)}
    assert bounds == {
        "prologue": (0, 0),
        "loop top + loads": (1, 1),
        "S = Q K^T": (2, 2),
        "S reduce + mask": (3, 4),
        "softmax + publish": (5, 5),
        "P V": (6, 7),
        "epilogue": (8, 8),
    }
    text = stall_phases.report(tmp_path / "k.csv")
    assert "23 warp samples" in text
    assert "S reduce + mask     17.4%  (short_sb 17.4%)" in text


def test_stall_phases_name_a_missing_landmark(tmp_path: Path) -> None:
    no_exp = [x for x in LOOP if not x[0].startswith("MUFU")]
    instrs = stall_phases.read_instructions(_sass_csv(tmp_path / "k.csv", no_exp))
    with pytest.raises(ValueError, match=r"MUFU\.EX2"):
        stall_phases.phase_bounds(instrs)


def _committed_profile(tmp_path: Path) -> Path:
    """Run 14's per-SASS samples of main at B=1, H=128, T=16, 32k (docs/kernel-journal.md), cut
    to the columns read_instructions reads: the input of docs/kernel.md's phase table."""
    path = tmp_path / "run14_sass_B1_H128_T16_L32768.csv"
    path.write_bytes(gzip.decompress((DATA / f"{path.name}.gz").read_bytes()))
    return path


def test_committed_profile_phases_cover_every_sample(tmp_path: Path) -> None:
    """The H200 profile splits without losing a sample, into docs/kernel.md's phase table."""
    path = _committed_profile(tmp_path)
    instrs = stall_phases.read_instructions(path)
    bounds = stall_phases.phase_bounds(instrs)
    covered = sum(sum(x["samples"] for x in instrs[lo : hi + 1]) for _, lo, hi in bounds)
    assert covered == sum(x["samples"] for x in instrs) == 70787
    assert [lo for _, lo, _ in bounds] == sorted(lo for _, lo, _ in bounds)
    text = stall_phases.report(path)
    for phase, share in [
        ("loop top + loads", 25.8),
        ("S = Q K^T", 21.7),
        ("S reduce + mask", 17.7),
        ("softmax + publish", 11.4),
        ("P V", 21.7),
    ]:
        assert f"  {phase:18s} {share:5.1f}%" in text


def test_committed_profile_executes_3_75_instructions_per_hmma(tmp_path: Path) -> None:
    instrs = stall_phases.read_instructions(_committed_profile(tmp_path))
    assert round(stall_phases.per_hmma(instrs), 2) == 3.75


def test_regions_count_instructions_per_hmma_and_their_stalls(tmp_path: Path) -> None:
    path = _sass_csv(tmp_path / "k.csv", LOOP)
    instrs = stall_phases.read_instructions(path)
    assert stall_phases.per_hmma(instrs) == pytest.approx(609 / 100)  # all executed / HMMA
    text = stall_phases.region_report(path, [("mma", 2, 4), ("loop", 1, 9)])
    assert "23 warp samples, 6.09 instructions per HMMA" in text
    assert "mma         56.5% of samples  2.00 per HMMA  (wait 76.9%, short_sb 23.1%)" in text
    assert "loop        95.7% of samples  6.08 per HMMA  (wait 63.6%, short_sb 36.4%)" in text
    with pytest.raises(ValueError, match="no HMMA"):
        stall_phases.region_report(path, [("rest", 5, 9)])
    with pytest.raises(ValueError, match="past the table"):
        stall_phases.region_report(path, [("all", 0, 10)])


def test_parse_region() -> None:
    assert stall_phases.parse_region("pv=540:962") == ("pv", 540, 962)
    for bad in ("pv=9:9", "pv540:962", "pv=a:b"):
        with pytest.raises(argparse.ArgumentTypeError):
            stall_phases.parse_region(bad)
