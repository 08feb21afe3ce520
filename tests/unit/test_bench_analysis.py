"""bench/compare_runs.py and bench/stall_phases.py: comparing result files shape by shape, and
splitting Nsight Compute's per-instruction samples into main-loop phases or explicit regions
(both run on committed files, no GPU)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import compare_runs
import stall_phases

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


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


def test_committed_profile_phases_cover_every_sample() -> None:
    """The committed H200 profile (gpu_run14_profile) splits without losing a sample."""
    path = RESULTS / "gpu_run14_profile" / "src_B1_H128_T16_L32768.sass.csv"
    instrs = stall_phases.read_instructions(path)
    bounds = stall_phases.phase_bounds(instrs)
    covered = sum(sum(x["samples"] for x in instrs[lo : hi + 1]) for _, lo, hi in bounds)
    assert covered == sum(x["samples"] for x in instrs) > 0
    assert [lo for _, lo, _ in bounds] == sorted(lo for _, lo, _ in bounds)


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


@pytest.mark.parametrize(
    ("run", "csv_name", "regions", "whole", "per_region"),
    [
        # docs/kernel.md's figures for the warp-specialized branch (runs 20 and 22)
        ("gpu_run20_ws_profile/run20.tgz", "run20/sass_ws.csv",
         [("pv", 540, 962), ("softmax", 2470, 2800)], 5.23, [5.62, 4.82]),
        ("gpu_run22_ws_unrolled/run22.tgz", "run22/sass_wsu.csv",
         [("pv", 520, 1980), ("softmax", 3450, 4500)], 4.03, [4.26, 3.76]),
    ],
)  # fmt: skip
def test_committed_warp_specialized_profiles(
    tmp_path: Path, run: str, csv_name: str, regions: list, whole: float, per_region: list
) -> None:
    with tarfile.open(RESULTS / run) as tar:
        tar.extract(csv_name, tmp_path, filter="data")
    instrs = stall_phases.read_instructions(tmp_path / csv_name)
    assert round(stall_phases.per_hmma(instrs), 2) == whole
    got = [round(stall_phases.per_hmma(instrs[lo:hi]), 2) for _, lo, hi in regions]
    assert got == per_region


def test_committed_main_profile_executes_3_75_instructions_per_hmma() -> None:
    path = RESULTS / "gpu_run18_profile_mode" / "sass_B1_H128_T16_L32768.csv"
    assert round(stall_phases.per_hmma(stall_phases.read_instructions(path)), 2) == 3.75
