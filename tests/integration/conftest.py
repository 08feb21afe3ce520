"""Fixtures that start REAL engine servers (subprocesses on loopback) for integration tests.

``reference_server(**cli_options) -> base_url`` spawns ``python -m kdtree_inference.engine`` on a
free 127.0.0.1 port, waits for ``GET /health`` to answer 200 and kills the server at teardown.
Keyword arguments become CLI flags (``fault_layer=1`` -> ``--fault-layer 1``; True -> bare flag;
None/False -> omitted). Reserved keywords: ``env`` (extra environment, e.g.
``{"KDTREE_VERIFY": "on"}``), ``wait_ready`` (False: return once the port accepts connections,
to observe the not-ready state), ``timeout`` (seconds to wait, default 120).
``reference_server_module`` is the same factory with module scope, for a server shared by a file.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _cli_flags(options: dict) -> list[str]:
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags


class ServerFactory:
    """Starts engine servers and stops every one of them in ``close``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[subprocess.Popen] = []

    def __call__(
        self, *, env: dict[str, str] | None = None, wait_ready: bool = True,
        timeout: float = 120.0, **cli_options: object,
    ) -> str:  # fmt: skip
        port = free_port()
        url = f"http://{LOOPBACK}:{port}"
        cmd = [sys.executable, "-m", "kdtree_inference.engine", "--host", LOOPBACK,
               "--port", str(port), *_cli_flags(cli_options)]  # fmt: skip
        log_path = self.log_dir / f"engine-{port}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        self.started.append(proc)
        self._wait(proc, url, log_path, timeout, wait_ready)
        return url

    @staticmethod
    def _wait(
        proc: subprocess.Popen, url: str, log_path: Path, timeout: float, ready: bool
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"engine exited with {proc.returncode} before ready:\n{tail}")
            try:
                status = httpx.get(url + "/health", timeout=2.0).status_code
                if status == 200 or not ready:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        tail = log_path.read_text(errors="replace")[-4000:]
        raise TimeoutError(f"engine at {url} not ready after {timeout}s:\n{tail}")

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.started:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


@pytest.fixture
def reference_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path_factory.mktemp("engine-logs"))
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def reference_server_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path_factory.mktemp("engine-logs"))
    yield factory
    factory.close()
