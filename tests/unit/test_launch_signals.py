"""``interrupts_deferred`` and ``stop_process``: how the demo keeps Ctrl-C from orphaning a child.

An interrupt that lands inside ``Popen()`` would leave the child running with nobody holding its
pid (seen once in CI: the demo's parity sidecar outlived the demo and held its stdout open). The
real signals are sent to this process; the children are real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from kdtree_inference.engine.launch import interrupts_deferred, stop_process


@pytest.fixture(autouse=True)
def _python_default_sigint():
    """Python's own SIGINT handler, as a terminal session starts it: a runner may have started
    the suite with SIGINT ignored (a background job without job control)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _signal_self_and_wait(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.2)  # the handler runs in here, on the next bytecode boundary


def test_a_ctrl_c_inside_the_block_is_delivered_after_the_child_is_bound() -> None:
    child = None
    with pytest.raises(KeyboardInterrupt):
        try:
            with interrupts_deferred():
                _signal_self_and_wait(signal.SIGINT)
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        finally:
            if child is not None:
                stop_process(child, timeout=5)
    assert child is not None and child.returncode is not None  # started, then stopped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_sigterm_goes_to_the_handler_that_was_installed_before_the_block() -> None:
    def to_interrupt(*_: object) -> None:
        raise KeyboardInterrupt("from SIGTERM")

    before = signal.signal(signal.SIGTERM, to_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt, match="from SIGTERM"), interrupts_deferred():
            _signal_self_and_wait(signal.SIGTERM)
            reached_end_of_block = True
        assert reached_end_of_block
        assert signal.getsignal(signal.SIGTERM) is to_interrupt
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_block_without_signals_changes_nothing() -> None:
    with interrupts_deferred():
        value = 1
    assert value == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_it_is_a_plain_block() -> None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with interrupts_deferred():  # signal.signal would raise ValueError off the main thread
                pass
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert errors == []


def test_stop_process_kills_a_child_that_ignores_sigterm() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "up"  # its SIGTERM handler is in place
    start = time.monotonic()
    stop_process(child, timeout=1)
    assert child.returncode == -signal.SIGKILL
    assert time.monotonic() - start < 10
    stop_process(child, timeout=1)  # already exited: nothing to do
