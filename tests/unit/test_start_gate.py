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


def in_a_scheduler_start(fn, module: str = "sglang.srt.managers.scheduler"):
    """``fn()`` called from a function named as SGLang's scheduler start, in ``module``."""
    namespace = {"__name__": module, "fn": fn}
    exec("def run_scheduler_process():\n    return fn()\n", namespace)
    return namespace["run_scheduler_process"]()


def test_only_sglang_s_scheduler_start_is_recognised() -> None:
    from kdtree_inference.sglang.start_gate import in_scheduler_start

    assert not in_scheduler_start()
    assert in_a_scheduler_start(in_scheduler_start)
    assert not in_a_scheduler_start(in_scheduler_start, module="elsewhere")


def test_a_scheduler_start_waits_for_its_gate(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    threading.Timer(0.3, gate.touch).start()
    env = {"KDTREE_START_GATE": str(gate), "KDTREE_START_GATE_TIMEOUT_S": "30"}
    assert in_a_scheduler_start(lambda: hold_scheduler(env)) >= 0.3


def test_settings_that_do_not_read_start_no_wait_and_say_why(tmp_path: Path, capfd) -> None:
    """The backend refuses them later, by name; the gate must not swallow that refusal."""
    env = {"KDTREE_START_GATE": str(tmp_path / "absent"), "KDTREE_VERIFY": "sometimes"}
    assert in_a_scheduler_start(lambda: hold_scheduler(env)) is None
    err = capfd.readouterr().err
    assert "kdtree: no start gate:" in err and "KDTREE_VERIFY" in err
