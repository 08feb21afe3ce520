"""Compare kernel_bench results shape by shape: our kernel's time in each run and its ratio to the first.

Usage: python -m kdtree_bench.analysis.compare_runs BASE.json OTHER.json [...]
Prints one row per grid shape present in every run (kdtree_us, then OTHER/BASE), and per run the
geometric-mean time ratio to BASE, its summary targets and its ceilings. Reads committed JSON
only; needs neither torch nor a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def shape_key(rec: dict) -> tuple[int, int, int, int]:
    return rec["B"], rec["H"], rec["T"], rec["prefix"]


def load(path: Path) -> dict:
    result = json.loads(path.read_text())
    result["by_shape"] = {shape_key(r): r for r in result["records"]}
    return result


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def compare(paths: list[Path]) -> str:
    runs = [load(p) for p in paths]
    names = [p.stem for p in paths]
    if len(set(names)) < len(names):  # e.g. several runs' kdtree_only.json: name them by folder
        names = [f"{p.parent.name}/{p.stem}" for p in paths]
    shapes = [k for k in runs[0]["by_shape"] if all(k in r["by_shape"] for r in runs[1:])]
    if not shapes:
        raise SystemExit("compare_runs: the runs share no grid shape")
    width = 2 + max(16, *(len(n) for n in names))
    lines = ["B   H   T   prefix  " + "".join(f"{n:>{width}}" for n in names)]
    ratios: list[list[float]] = [[] for _ in runs]
    for key in shapes:
        base = runs[0]["by_shape"][key]["kdtree_us"]
        cells = []
        for i, run in enumerate(runs):
            us = run["by_shape"][key]["kdtree_us"]
            ratios[i].append(us / base)
            cells.append(f"{us:.1f}" if i == 0 else f"{us:.1f} ({us / base:.2f})")
        b, h, t, p = key
        lines.append(f"{b:<3} {h:<3} {t:<3} {p:<7} " + "".join(f"{c:>{width}}" for c in cells))
    lines.append("")
    for name, run, r in zip(names, runs, ratios, strict=True):
        s = run.get("summary", {})
        lines.append(
            f"{name}: time / {names[0]} geomean {geomean(r):.3f} (best {min(r):.2f}, worst "
            f"{max(r):.2f}); efficiency median {s.get('efficiency_median_ideal_ge_10us')} min "
            f"{s.get('efficiency_min_ideal_ge_10us')}; max small-shape us "
            f"{s.get('max_us_ideal_lt_10us')}; ceilings {run.get('ceilings')}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_JSON")
    args = parser.parse_args()
    print(compare(args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
