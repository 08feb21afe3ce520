"""`make demo`'s program end to end: two real servers, a comparison, servers always stopped."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from kdtree_inference.engine.launch import health_status

# CPU explicitly: on a GPU machine the demo would pick the GPU backends (triton vs op).
DEMO = [sys.executable, "-m", "kdtree_inference.engine.demo", "--device", "cpu"]


def _urls(output: str) -> list[str]:
    match = re.search(r"servers ready: baseline (\S+), candidate (\S+)", output)
    assert match, output
    return [match.group(1).rstrip(","), match.group(2)]


def test_demo_compares_baseline_and_candidate(tmp_path) -> None:
    run = subprocess.run(
        [*DEMO, "--prompts", "3", "--max-new-tokens", "12", "--log-dir", str(tmp_path), "--strict"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "'attention_backend': 'reference'" in run.stdout  # baseline: KDTREE_VERIFY=off
    assert "'attention_backend': 'op'" in run.stdout  # candidate: KDTREE_VERIFY=on
    assert "3/3 prompts token-for-token identical" in run.stdout
    assert all(health_status(url) is None for url in _urls(run.stdout))  # both stopped


def test_demo_shows_a_faulty_candidate(tmp_path) -> None:
    run = subprocess.run(
        [
            *DEMO,
            "--prompts",
            "3",
            "--max-new-tokens",
            "12",
            "--log-dir",
            str(tmp_path),
            "--candidate-fault-layer",
            "1",
            "--candidate-fault-scale",
            "3",
            "--strict",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "DIFFERS at token" in run.stdout
    assert all(health_status(url) is None for url in _urls(run.stdout))


def test_demo_stops_servers_on_interrupt(tmp_path) -> None:
    # Ctrl-C as a terminal delivers it: a runner that started us with SIGINT ignored (a
    # background job without job control) would hand that on to the demo.
    proc = subprocess.Popen(
        [*DEMO, "--prompts", "64", "--max-new-tokens", "512", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    output = ""
    deadline = time.monotonic() + 240
    while "servers ready" not in output and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"demo exited early: {output}"
        output += line
    urls = _urls(output)
    assert all(health_status(url) == 200 for url in urls)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output + rest
    assert all(health_status(url) is None for url in urls)
