#!/usr/bin/env python3
"""SGLang's own profiler around one decode of a real server, and what its traces say.

``profile_decode`` brackets one /generate call with SGLang's ``/start_profile`` and
``/stop_profile`` (the torch profiler inside the scheduler, GPU activity only, no stacks), so the
trace holds exactly that call's forwards; SGLang writes it as ``*.trace.json.gz`` into the
directory it is given. ``trace_times`` reads such a Chrome trace into GPU time per kernel name
and the time the GPU was busy at all (kernels that overlap, as a programmatic dependent launch
overlaps its predecessor's drain, count once there and in full in their own sums), and
``comparison_markdown`` sets configurations side by side per verify step: where one server
spends the time the other does not. ``bench/kdtree_bench/e2e/sglang_e2e.py --profile-shape`` runs it after the
timed repetitions of one shape; this file's CLI summarizes trace folders again:

    python -m kdtree_bench.profiling.sglang_profile OUT/profile/off OUT/profile/on [--steps N N] [--top 15]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Chrome-trace categories of GPU work the torch profiler records (CUPTI), graph replays included.
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
NAME_WIDTH = 90  # kernel names are C++ templates; a table cell keeps their head
# Kernels whose busy time is also reported on its own, by a part of their names: the verify
# kernel's (attention, combine, plan) and SGLang's Triton extend attention (verify, draft extend).
BUSY_GROUPS = {"kdtree's kernels": "kdtree::", "Triton `*_fwd_kernel*`": "_fwd_kernel"}


@dataclass(frozen=True)
class KernelTime:
    total_us: float
    calls: int


@dataclass(frozen=True)
class ProfiledDecode:
    """One profiled generation: its traces, and the verify steps it took (per-step figures)."""

    configuration: str
    traces: tuple[Path, ...]
    verify_steps: int
    generated_tokens: int
    wall_s: float


def profile_decode(
    server: Any,
    generate: Callable[[], tuple[list[dict[str, Any]], float]],
    out_dir: Path,
    timeout_s: float,
) -> ProfiledDecode:
    """Run ``generate`` (one /generate call on ``server``) between /start_profile and
    /stop_profile; the trace goes to ``out_dir``. Raises RuntimeError if SGLang wrote none."""
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "output_dir": str(out_dir.resolve()),
        "activities": ["GPU"],
        "with_stack": False,
        "record_shapes": False,
        "profile_prefix": server.spec.name,
    }
    server.post_text("/start_profile", body, timeout_s)
    try:
        answers, wall_s = generate()
    finally:
        # Exports the trace before it answers.
        server.post_text("/stop_profile", {}, timeout_s)
    traces = tuple(sorted(out_dir.glob("*.trace.json.gz")))
    if not traces:
        raise RuntimeError(f"{server.spec.name}: SGLang wrote no trace into {out_dir}")
    steps = max(a["meta_info"].get("spec_verify_ct") or 0 for a in answers)
    generated = sum(a["meta_info"]["completion_tokens"] for a in answers)
    return ProfiledDecode(server.spec.name, traces, steps, generated, round(wall_s, 4))


@dataclass(frozen=True)
class GpuTime:
    """What a trace (or a rank's traces, summed) says of the GPU's work."""

    kernels: dict[str, KernelTime]
    busy_us: float
    """The union of the GPU's intervals per device: overlapping work counted once."""
    group_busy_us: dict[str, float]
    """``busy_us`` of each ``BUSY_GROUPS`` group's kernels alone."""


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def trace_times(trace: Path) -> GpuTime:
    """GPU time per kernel (and copy/memset) name in one Chrome trace, ``.json`` or ``.json.gz``,
    and the time its devices were busy."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as handle:
        data = json.load(handle)
    events = data["traceEvents"] if isinstance(data, dict) else data
    totals: dict[str, list[float]] = {}
    # Per (group, device); group None is every kernel.
    intervals: dict[tuple[str | None, Any], list[tuple[float, float]]] = {}
    for event in events:
        if event.get("ph") != "X" or event.get("cat") not in GPU_CATEGORIES:
            continue
        name, duration = event["name"], float(event.get("dur", 0.0))
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += duration
        entry[1] += 1
        start = float(event.get("ts", 0.0))
        groups = [None] + [g for g, part in BUSY_GROUPS.items() if part in name]
        for group in groups:
            intervals.setdefault((group, event.get("pid")), []).append((start, start + duration))

    def busy(group: str | None) -> float:
        return sum(busy_time(iv) for (g, _), iv in intervals.items() if g == group)

    return GpuTime(
        {name: KernelTime(total, int(calls)) for name, (total, calls) in totals.items()},
        busy(None),
        {group: busy(group) for group in BUSY_GROUPS},
    )


def merged_times(traces: tuple[Path, ...]) -> GpuTime:
    """``trace_times`` summed over several traces (one per rank)."""
    merged: dict[str, KernelTime] = {}
    busy = 0.0
    group_busy = dict.fromkeys(BUSY_GROUPS, 0.0)
    for trace in traces:
        times = trace_times(trace)
        busy += times.busy_us
        for group, us in times.group_busy_us.items():
            group_busy[group] += us
        for name, t in times.kernels.items():
            prior = merged.get(name, KernelTime(0.0, 0))
            merged[name] = KernelTime(prior.total_us + t.total_us, prior.calls + t.calls)
    return GpuTime(merged, busy, group_busy)


def _short(name: str) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def comparison(times: dict[str, GpuTime], steps: dict[str, int], top: int = 15) -> dict[str, Any]:
    """Per configuration: GPU µs per verify step in all (the kernels' sum, and the time the GPU
    was busy); per kernel, µs per step in each configuration, the ``top`` kernels by their
    largest per-step difference (by time with one configuration)."""
    per_step = {
        conf: {name: t.total_us / max(steps[conf], 1) for name, t in gpu.kernels.items()}
        for conf, gpu in times.items()
    }
    names = sorted({name for kernels in per_step.values() for name in kernels})

    def spread(name: str) -> float:
        values = [per_step[conf].get(name, 0.0) for conf in per_step]
        return max(values) - min(values) if len(values) > 1 else values[0]

    ranked = sorted(names, key=spread, reverse=True)[:top]
    return {
        "configurations": list(times),
        "verify_steps": steps,
        "gpu_us_per_step": {conf: round(sum(v.values()), 2) for conf, v in per_step.items()},
        "gpu_busy_us_per_step": {
            conf: round(gpu.busy_us / max(steps[conf], 1), 2) for conf, gpu in times.items()
        },
        "group_busy_us_per_step": {
            group: {
                conf: round(gpu.group_busy_us.get(group, 0.0) / max(steps[conf], 1), 2)
                for conf, gpu in times.items()
            }
            for group in BUSY_GROUPS
        },
        "kernels": [
            {
                "name": name,
                "us_per_step": {conf: round(per_step[conf].get(name, 0.0), 3) for conf in times},
                "calls": {
                    conf: times[conf].kernels.get(name, KernelTime(0, 0)).calls for conf in times
                },
            }
            for name in ranked
        ],
    }


def comparison_markdown(table: dict[str, Any]) -> str:
    confs = table["configurations"]
    lines = [
        "| | " + " | ".join(confs) + " |",
        "|---|" + "---|" * len(confs),
        "| verify steps | " + " | ".join(str(table["verify_steps"][c]) for c in confs) + " |",
        "| GPU µs per step, all kernels | "
        + " | ".join(f"{table['gpu_us_per_step'][c]:.1f}" for c in confs)
        + " |",
        "| GPU busy µs per step (overlaps once) | "
        + " | ".join(f"{table['gpu_busy_us_per_step'][c]:.1f}" for c in confs)
        + " |",
        *(
            f"| GPU busy µs per step, {group} | "
            + " | ".join(f"{by_conf[c]:.1f}" for c in confs)
            + " |"
            for group, by_conf in table["group_busy_us_per_step"].items()
        ),
        "",
        "| kernel (µs per verify step, calls) | " + " | ".join(confs) + " |",
        "|---|" + "---|" * len(confs),
    ]
    for row in table["kernels"]:
        cells = [f"{row['us_per_step'][c]:.2f} ({row['calls'][c]})" for c in confs]
        lines.append(f"| `{_short(row['name'])}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dirs", type=Path, nargs="+", help="trace folders, one per configuration")
    parser.add_argument(
        "--steps",
        type=int,
        nargs="+",
        help="verify steps of each folder's decode (default 1: totals, not per step)",
    )
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    steps = args.steps or [1] * len(args.dirs)
    if len(steps) != len(args.dirs):
        print("sglang_profile: --steps needs one count per folder", file=sys.stderr)
        return 2
    times, counts = {}, {}
    for folder, n in zip(args.dirs, steps, strict=True):
        traces = tuple(sorted(folder.glob("*.trace.json*")))
        if not traces:
            print(f"sglang_profile: no *.trace.json[.gz] in {folder}", file=sys.stderr)
            return 2
        times[folder.name], counts[folder.name] = merged_times(traces), n
    sys.stdout.write(comparison_markdown(comparison(times, counts, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
