"""A starting SGLang scheduler held, after its imports and before its first CUDA call, until a
file exists.

Servers that share one GPU must not size their memory pools at the same time: each sizes its KV
pool from the memory it finds free, and another server allocating meanwhile makes it take less
or refuse to start. So a harness starts them one after another, each once the one before holds
its pools. Most of a start is imports, though, about a minute a server on the GPU machine, none
of it on the GPU. With ``KDTREE_START_GATE=PATH`` a scheduler process (SGLang's
``run_scheduler_process`` calls ``load_plugins()`` first, and the plugin holds it there) waits
until PATH exists: the harness starts every server at once and opens each gate when the server
before it holds its pools, so the imports overlap and the memory measurements still take turns.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ..settings import InferenceSettings, SettingsError

SCHEDULER_START = ("sglang.srt.managers.scheduler", "run_scheduler_process")
"""Where SGLang 0.5.23 starts a scheduler process: the module and function on the stack."""


def in_scheduler_start() -> bool:
    """True when SGLang's ``run_scheduler_process`` is on the stack. ``load_plugins()`` also runs
    in the launcher and the detokenizer, which neither measure nor hold GPU memory."""
    module, function = SCHEDULER_START
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back
    return False


def hold_until_open(gate: Path, timeout_s: float, poll_s: float = 0.2) -> float:
    """Wait until ``gate`` exists; the seconds waited. After ``timeout_s`` the start goes on,
    with a warning: a harness that died must not leave servers waiting for ever."""
    started = time.monotonic()
    if not gate.exists():
        _say(f"waiting for the start gate {gate}")
    while not gate.exists():
        waited = time.monotonic() - started
        if waited >= timeout_s:
            _say(
                f"the start gate {gate} did not open in {timeout_s:.0f} s; starting anyway "
                "(KDTREE_START_GATE_TIMEOUT_S)"
            )
            return waited
        time.sleep(poll_s)
    waited = time.monotonic() - started
    _say(f"the start gate {gate} opened after {waited:.1f} s")
    return waited


def _say(message: str) -> None:
    # To stderr: SGLang configures logging only after load_plugins(), so a logger would be silent.
    print(f"kdtree: {message}", file=sys.stderr, flush=True)


def hold_scheduler(env: Mapping[str, str]) -> float | None:
    """In a scheduler's start with ``KDTREE_START_GATE`` set, wait for the gate (seconds waited);
    elsewhere, or unset, return None at once. Settings that do not read start no wait: the
    backend refuses them, by name, when SGLang builds it."""
    if not in_scheduler_start():
        return None
    try:
        settings = InferenceSettings.from_env(env)
    except SettingsError as error:
        _say(f"no start gate: {error}")
        return None
    if settings.start_gate is None:
        return None
    return hold_until_open(settings.start_gate, settings.start_gate_timeout_s)
