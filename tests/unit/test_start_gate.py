"""The start gate's wait: it ends when the file appears, or at its timeout, saying which; outside
a scheduler's start, or with no gate set, nothing waits."""

import threading
import time
from pathlib import Path

from kdtree_inference.sglang.start_gate import hold_scheduler, hold_until_open


def test_the_wait_ends_when_the_gate_appears(tmp_path: Path, capfd) -> None:
    gate = tmp_path / "gate"
    threading.Timer(0.5, gate.touch).start()
    waited = hold_until_open(gate, timeout_s=30, poll_s=0.05)
    assert 0.5 <= waited < 10
    err = capfd.readouterr().err
    assert f"kdtree: waiting for the start gate {gate}" in err
    assert f"kdtree: the start gate {gate} opened after" in err


def test_an_open_gate_does_not_wait(tmp_path: Path, capfd) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    assert hold_until_open(gate, timeout_s=30) < 1
    assert "waiting" not in capfd.readouterr().err


def test_a_gate_that_never_opens_lets_the_start_go_on_at_its_timeout(tmp_path, capfd) -> None:
    gate = tmp_path / "never"
    waited = hold_until_open(gate, timeout_s=0.4, poll_s=0.05)
    assert 0.4 <= waited < 5
    assert "did not open in 0 s; starting anyway (KDTREE_START_GATE_TIMEOUT_S)" in (
        capfd.readouterr().err
    )


def test_nothing_waits_without_a_gate_or_outside_a_scheduler_start(tmp_path: Path) -> None:
    started = time.monotonic()
    assert hold_scheduler({}) is None
    # This process is no scheduler: a gate that does not exist holds nothing.
    assert hold_scheduler({"KDTREE_START_GATE": str(tmp_path / "absent")}) is None
    assert time.monotonic() - started < 1
