"""Where the attention kernel's warps spend their time, per main-loop phase, from Nsight Compute.

Input: the per-SASS-instruction CSV of an ncu report with the SourceCounters section
(``ncu -i REPORT.ncu-rep --page source --csv --print-source sass > FILE.csv``; see
``bench/gpu_session.sh profile``). Warp-state samples are summed per phase of the main loop,
delimited by landmark instructions in program order:

    loop top + loads   first instruction executed as often as the first HMMA .. first HMMA
    S = Q K^T          the S-phase HMMAs, up to the first STS.128 (the partial-S exchange)
    S reduce + mask    up to the first MUFU.EX2
    softmax + publish  up to the first LDSM.16.MT88 (V fragments of P V)
    P V                up to the loop's back branch (last instruction executed as often)

Prints each phase's share of all samples and its top stall reasons (share of all samples), and
the instructions the whole kernel executes per HMMA.

Kernels without those landmarks (the warp-specialized branch, whose two warp roles run two
loops) are split by explicit regions instead: ``--region NAME=LO:HI`` sums rows LO..HI-1 of the
SASS table (0-based, header lines excluded) and prints their share of the samples, the
instructions they execute per HMMA and their top stall reasons (share of the region's samples).

Usage: python -m kdtree_bench.profiling.stall_phases [--region NAME=LO:HI ...] FILE.csv [FILE.csv ...]
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

STALL_PREFIX = "stall_"
LANDMARKS = (
    ("S = Q K^T", "HMMA"),
    ("S reduce + mask", "STS.128"),
    ("softmax + publish", "MUFU.EX2"),
    ("P V", "LDSM.16.MT88"),
)


def read_instructions(path: Path) -> list[dict]:
    """Rows of the SASS table (ncu writes the kernel name on the first line, then the header)."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header = rows[1]
    stalls = [h for h in header if h.startswith(STALL_PREFIX) and "(Not Issued)" not in h]
    records = []
    for row in rows[2:]:
        rec = dict(zip(header, row, strict=False))
        records.append(
            {
                "sass": rec["Source"].strip(),
                "executed": int(rec["Instructions Executed"] or 0),
                "samples": int(rec["# Samples"] or 0),
                "stalls": {h[len(STALL_PREFIX) :]: int(rec[h] or 0) for h in stalls},
            }
        )
    return records


def opcode(sass: str) -> str:
    words = sass.split()
    return words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0]


def phase_bounds(instrs: list[dict]) -> list[tuple[str, int, int]]:
    """[(phase, first index, last index)] from the landmarks (ValueError if one is missing)."""
    first_hmma = next(i for i, x in enumerate(instrs) if opcode(x["sass"]).startswith("HMMA"))
    hot = instrs[first_hmma]["executed"]
    start = next(i for i, x in enumerate(instrs) if x["executed"] == hot)
    end = max(i for i, x in enumerate(instrs) if x["executed"] == hot)
    marks = [("loop top + loads", start)]
    pos = start
    for name, prefix in LANDMARKS:
        found = next(
            (i for i in range(pos, end + 1) if opcode(instrs[i]["sass"]).startswith(prefix)), None
        )
        if found is None:
            raise ValueError(f"landmark {prefix} of phase '{name}' not found in the main loop")
        marks.append((name, found))
        pos = found + 1
    bounds = [("prologue", 0, start - 1)]
    for (name, lo), (_, hi) in zip(marks, [*marks[1:], ("", end + 1)], strict=True):
        bounds.append((name, lo, hi - 1))
    bounds.append(("epilogue", end + 1, len(instrs) - 1))
    return bounds


def per_hmma(instrs: list[dict]) -> float:
    """Instructions executed per HMMA executed."""
    hmma = sum(x["executed"] for x in instrs if opcode(x["sass"]).startswith("HMMA"))
    if not hmma:
        raise ValueError("no HMMA executed in these instructions")
    return sum(x["executed"] for x in instrs) / hmma


def parse_region(text: str) -> tuple[str, int, int]:
    """'pv=540:962' -> ('pv', 540, 962)."""
    try:
        name, bounds = text.split("=")
        lo, hi = (int(x) for x in bounds.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=LO:HI; got {text!r}") from None
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"need 0 <= LO < HI; got {text!r}")
    return name, lo, hi


def _header(path: Path, instrs: list[dict]) -> str:
    total = sum(x["samples"] for x in instrs) or 1
    return f"{path.name}: {total} warp samples, {per_hmma(instrs):.2f} instructions per HMMA"


def _top_stalls(part: list[dict], denominator: int) -> str:
    """The 4 commonest stall reasons of ``part``, each as a share of ``denominator`` samples."""
    reasons: Counter[str] = Counter()
    for x in part:
        reasons.update(x["stalls"])
    return ", ".join(f"{k} {100 * v / denominator:.1f}%" for k, v in reasons.most_common(4) if v)


def region_report(path: Path, regions: list[tuple[str, int, int]]) -> str:
    instrs = read_instructions(path)
    total = sum(x["samples"] for x in instrs) or 1
    lines = [_header(path, instrs)]
    for name, lo, hi in regions:
        if hi > len(instrs):
            raise ValueError(f"region {name} ends at {hi}, past the table's {len(instrs)} rows")
        part = instrs[lo:hi]
        samples = sum(x["samples"] for x in part) or 1
        lines.append(
            f"  {name:10s} {100 * samples / total:5.1f}% of samples  "
            f"{per_hmma(part):.2f} per HMMA  ({_top_stalls(part, samples)})"
        )
    return "\n".join(lines)


def report(path: Path) -> str:
    instrs = read_instructions(path)
    total = sum(x["samples"] for x in instrs) or 1
    lines = [_header(path, instrs)]
    for name, lo, hi in phase_bounds(instrs):
        part = instrs[lo : hi + 1]
        samples = sum(x["samples"] for x in part)
        lines.append(f"  {name:18s} {100 * samples / total:5.1f}%  ({_top_stalls(part, total)})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="+", type=Path)
    parser.add_argument("--region", type=parse_region, action="append", metavar="NAME=LO:HI")
    args = parser.parse_args()
    if args.region:
        print("\n\n".join(region_report(p, args.region) for p in args.csv))
    else:
        print("\n\n".join(report(p) for p in args.csv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
