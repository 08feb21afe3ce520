"""Start and stop engine servers as subprocesses on loopback (used by the demo and the tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def cli_flags(options: dict) -> list[str]:
    """``{"fault_layer": 1, "x": True, "y": None}`` -> ``["--fault-layer", "1", "--x"]``."""
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver the first one caught.

    Start a child inside the block and bind it where a ``finally`` can stop it: an interrupt that
    lands inside ``Popen()`` itself would otherwise leave the child running with nobody holding
    its pid. The child starts with default handlers (exec resets caught signals). Python delivers
    signals to the main thread only, so elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: caught.append(signum)) for sig in held
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            signal.raise_signal(caught[0])


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; nothing if it has already exited."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def health_status(url: str) -> int | None:
    """HTTP status of GET /health, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


class EngineProcess:
    """One ``python -m kdtree_inference.engine`` server; its output goes to ``log_path``."""

    def __init__(
        self,
        log_path: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
        **cli_options: object,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_path
        cmd = [
            sys.executable,
            "-m",
            "kdtree_inference.engine",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            *cli_flags(cli_options),
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log_file:
            self.proc = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait(self, timeout: float = 120.0, ready: bool = True) -> None:
        """Until /health is 200 (or, with ready=False, until anything answers)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"engine exited with {self.proc.returncode} before ready:\n{self.log_tail()}"
                )
            status = health_status(self.url)
            if status == 200 or (status is not None and not ready):
                return
            time.sleep(0.1)
        raise TimeoutError(f"engine at {self.url} not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        stop_process(self.proc, timeout)
