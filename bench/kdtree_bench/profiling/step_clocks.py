#!/usr/bin/env python3
"""The GPU's clocks during each timed repetition of a speed run.

``bench/sglang_gpu.sh speed`` logs ``nvidia-smi``'s clocks, power, utilization and throttle
reasons every 200 ms (``speed/gpu_clocks.csv``) while ``bench/kdtree_bench/e2e/sglang_e2e.py`` times its
repetitions, each with its start (``started_at``, Unix time) and wall time in ``speed.json``.
This lines the two up: per configuration, shape and repetition, the step time beside the median
and lowest SM clock, the mean power and utilization, and every throttle reason seen. A step that
is slow while the clocks held points at the host; one that is slow with them down points at the
GPU's power management.

    python -m kdtree_bench.profiling.step_clocks OUT/speed/speed.json OUT/speed/gpu_clocks.csv [--out FILE.md]

nvidia-smi writes local time; run this where the log was written (the speed phase does).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import operator
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kdtree_bench.cli import emit_table

TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"
SUMMARY_FIELDS = ("sm_mhz_median", "sm_mhz_min", "power_w_mean", "utilization_pct_mean", "throttle")
"""What ``during`` reports of the clock samples inside a repetition."""


@dataclass(frozen=True)
class ClockSample:
    at: float  # Unix time
    sm_mhz: float
    power_w: float
    utilization_pct: float
    throttle: int  # the active clock-event (throttle) reasons, a bit mask


def _number(text: str) -> float:
    """A value of nvidia-smi's ``nounits`` CSV; ``[N/A]`` and the like read as NaN."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def read_clocks(path: Path) -> list[ClockSample]:
    """``gpu_clocks.csv`` as samples, in time order. Lines that are not samples (a repeated
    header, an nvidia-smi message) are skipped; a log without a single sample is refused."""
    samples = []
    with path.open(newline="") as handle:
        for row in csv.reader(handle, skipinitialspace=True):
            if len(row) != 7:
                continue
            try:
                at = datetime.strptime(row[0], TIME_FORMAT).timestamp()
            except ValueError:
                continue
            sm, _, power, utilization, _, throttle = row[1:]
            samples.append(
                ClockSample(
                    at, _number(sm), _number(power), _number(utilization), int(throttle, 16)
                )
            )
    if not samples:
        raise ValueError(f"{path}: no clock samples (is it nvidia-smi's --format=csv,nounits log?)")
    return sorted(samples, key=lambda s: s.at)


def repetitions(speed: dict[str, Any]) -> list[dict[str, Any]]:
    """Every timed repetition of ``speed.json`` with a start time, in time order."""
    found = []
    for record in speed["records"]:
        for index, sample in enumerate(record.get("samples", [])):
            if sample.get("started_at") is None:
                continue
            found.append(
                {
                    "configuration": record["configuration"],
                    "batch": record["batch"],
                    "prompt_len": record["prompt_len"],
                    "repetition": index,
                    "start": sample["started_at"],
                    "wall_s": sample["wall_s"],
                    "step_ms": sample["step_ms"],
                    "host_busy_cpus": sample.get("host_busy_cpus"),
                }
            )
    return sorted(found, key=lambda r: r["start"])


def during(rep: dict[str, Any], clocks: list[ClockSample]) -> dict[str, Any]:
    """The clock samples inside one repetition's wall time, summarized (None where none fell
    inside: a repetition shorter than the log's interval)."""
    end = rep["start"] + rep["wall_s"]
    inside = [c for c in clocks if rep["start"] <= c.at <= end]
    if not inside:
        return {**rep, "samples": 0, **dict.fromkeys(SUMMARY_FIELDS)}
    return {
        **rep,
        "samples": len(inside),
        "sm_mhz_median": statistics.median(c.sm_mhz for c in inside),
        "sm_mhz_min": min(c.sm_mhz for c in inside),
        "power_w_mean": round(statistics.fmean(c.power_w for c in inside), 1),
        "utilization_pct_mean": round(statistics.fmean(c.utilization_pct for c in inside), 1),
        "throttle": f"{functools.reduce(operator.or_, (c.throttle for c in inside)):#x}",
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    lines = [
        "| configuration | batch x prompt | repetition | step ms | host CPUs busy | clock samples "
        "| SM MHz median (min) | power W | utilization % | throttle reasons |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        clocks = (
            "-"
            if r["sm_mhz_median"] is None
            else f"{r['sm_mhz_median']:.0f} ({r['sm_mhz_min']:.0f})"
        )
        lines.append(
            f"| {r['configuration']} | {r['batch']}x{r['prompt_len']} | {r['repetition']} | "
            f"{cell(r['step_ms'])} | {cell(r['host_busy_cpus'])} | {r['samples']} | {clocks} | "
            f"{cell(r['power_w_mean'])} | "
            f"{cell(r['utilization_pct_mean'])} | {cell(r['throttle'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("speed_json", type=Path)
    parser.add_argument("clocks_csv", type=Path)
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        speed = json.loads(args.speed_json.read_text())
        clocks = read_clocks(args.clocks_csv)
    except (OSError, ValueError) as error:
        print(f"step_clocks: {error}", file=sys.stderr)
        return 2
    reps = repetitions(speed)
    if not reps:
        print(f"step_clocks: {args.speed_json} has no repetition with started_at", file=sys.stderr)
        return 2
    emit_table(markdown([during(rep, clocks) for rep in reps]), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
