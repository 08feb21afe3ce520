"""Shared by the parity sidecar's integration tests: a small corpus and a strict policy, the CLI
as a subprocess, a run's only report, and the pid listening on a server's port."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import yaml

from kdtree_parity.corpus import load_corpus
from kdtree_parity.policy import parse_policy

# Small enough for a 2-core CI box, strict enough to mean something: the reference engine is
# float32 and deterministic, so identical servers must match exactly.
POLICY = """
replay:
  max_new_tokens: 8
  top_logprobs_num: 5
  concurrency: 2
  timeout_s: 60
  retries: 1
  backoff_s: 0.2
  health_deadline_s: 60
  max_consecutive_transport_errors: 2
compare:
  near_tie_epsilon: 0.05
gate:
  min_prompts: {min_prompts}
  max_hard_divergences: 0
  min_exact_match_rate: 0.9
  max_excess_divergence_rate: 0.05
  max_logprob_drift_p99: 0.01
  # These tests judge tokens, logprobs and transport between servers that share two loaded
  # cores; the speed rule has its own tests (test_parity_floor_and_speed.py, test_promote.py).
  max_slowdown: null
"""


def write_inputs(
    tmp_path: Path, prompts: int, gate: dict | None = None, **replay: object
) -> tuple[Path, Path]:
    """The first ``prompts`` entries of the shipped short corpus, and the test policy with
    ``replay`` and ``gate`` overrides."""
    lines = load_corpus("short").raw.decode().splitlines()[:prompts]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    data = yaml.safe_load(POLICY.format(min_prompts=prompts))
    data["replay"].update(replay)
    data["gate"].update(gate or {})
    text = yaml.safe_dump(data)
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    parse_policy(text)  # a typo in a test policy should fail here, not as a verdict
    return corpus, policy


def run_cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``kdtree-parity ARGS`` in a subprocess; stdout and stderr kept apart."""
    return subprocess.run(
        [sys.executable, "-m", "kdtree_parity.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def gate_command(
    baseline: str,
    candidate: str,
    corpus: str | Path,
    policy: str | Path,
    out: Path,
    db: Path,
    *more: str | Path,
) -> list[str]:
    """The ``kdtree-parity run`` of a baseline and a candidate with a corpus and a policy, reports
    to OUT, runs stored in DB, no progress bar, ``more`` flags after those: the command line."""
    flags = {"--baseline": baseline, "--candidate": candidate, "--corpus": corpus}
    flags |= {"--policy": policy, "--out": out, "--db": db}
    pairs = [str(item) for flag, value in flags.items() for item in (flag, value)]
    return [
        sys.executable,
        "-m",
        "kdtree_parity.cli",
        "run",
        *pairs,
        "--no-progress",
        *map(str, more),
    ]


def run_gate(*args: str | Path) -> subprocess.CompletedProcess:
    """:func:`gate_command`'s run to its end (its arguments are gate_command's)."""
    return run_cli(*gate_command(*args)[3:])


def only_report(out: Path) -> dict:
    reports = list(out.glob("*/report.json"))
    assert len(reports) == 1, reports
    return json.loads(reports[0].read_text())


def listener_pid(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    pids = {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
    }
    assert len(pids) == 1, pids
    return pids.pop()
