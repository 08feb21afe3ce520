#!/usr/bin/env python3
"""SGLang's own profiler around one decode of a real server, and what its traces say.

``profile_decode`` brackets one /generate call with SGLang's ``/start_profile`` and
``/stop_profile`` (the torch profiler inside the scheduler, GPU activity only, no stacks), so the
trace holds exactly that call's forwards; SGLang writes it as ``*.trace.json.gz`` into the
directory it is given. ``kernel_times`` reads such a Chrome trace into GPU time per kernel name,
and ``comparison_markdown`` sets configurations side by side per verify step: where one server
spends the time the other does not. ``bench/sglang_e2e.py --profile-shape`` runs it after the
timed repetitions of one shape; this file's CLI summarizes trace folders again:

    python bench/sglang_profile.py OUT/profile/off OUT/profile/on [--steps N N] [--top 15]
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


def kernel_times(trace: Path) -> dict[str, KernelTime]:
    """GPU time per kernel (and copy/memset) name in one Chrome trace, ``.json`` or ``.json.gz``."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as handle:
        data = json.load(handle)
    events = data["traceEvents"] if isinstance(data, dict) else data
    totals: dict[str, list[float]] = {}
    for event in events:
        if event.get("ph") != "X" or event.get("cat") not in GPU_CATEGORIES:
            continue
        entry = totals.setdefault(event["name"], [0.0, 0])
        entry[0] += float(event.get("dur", 0.0))
        entry[1] += 1
    return {name: KernelTime(total, int(calls)) for name, (total, calls) in totals.items()}


def merged_times(traces: tuple[Path, ...]) -> dict[str, KernelTime]:
    """``kernel_times`` summed over several traces (one per rank)."""
    merged: dict[str, KernelTime] = {}
    for trace in traces:
        for name, t in kernel_times(trace).items():
            prior = merged.get(name, KernelTime(0.0, 0))
            merged[name] = KernelTime(prior.total_us + t.total_us, prior.calls + t.calls)
    return merged


def _short(name: str) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def comparison(
    times: dict[str, dict[str, KernelTime]], steps: dict[str, int], top: int = 15
) -> dict[str, Any]:
    """Per configuration: GPU µs per verify step in all; per kernel, µs per step in each
    configuration, the ``top`` kernels by their largest per-step difference (by time with one
    configuration)."""
    per_step = {
        conf: {name: t.total_us / max(steps[conf], 1) for name, t in kernels.items()}
        for conf, kernels in times.items()
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
        "kernels": [
            {
                "name": name,
                "us_per_step": {conf: round(per_step[conf].get(name, 0.0), 3) for conf in times},
                "calls": {conf: times[conf].get(name, KernelTime(0, 0)).calls for conf in times},
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
