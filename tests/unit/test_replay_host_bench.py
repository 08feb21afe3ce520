"""bench/kdtree_bench/profiling/replay_host_bench.py end to end on the CPU, with few replays: the
tool's own check (every replay counted all 61 layers' kernel calls) holds, and the record says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_timed_replay_runs_the_backends_whole_replay_hook(tmp_path: Path) -> None:
    out = tmp_path / "replay_host.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "bench")}
    command = [sys.executable, "-m", "kdtree_bench.profiling.replay_host_bench"]
    args = ["--calls", "10", "--repeats", "2", "--warmup", "1", "--out", str(out)]
    done = subprocess.run(command + args, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    # warm-up and timed calls, each one replay the backend counted as a verify step
    assert record["replays_counted"] == 1 + 2 * 10
    assert len(record["added_us"]["runs"]) == 2
    assert record["added_us"]["min"] <= record["added_us"]["median"] <= record["added_us"]["max"]
    assert out.with_suffix(".log").read_text().startswith("kdtree_inference from ")
