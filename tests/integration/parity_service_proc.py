"""``kdtree-parity serve`` as a real uvicorn subprocess on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from kdtree_inference.engine.launch import free_port, stop_process


class ParityService:
    """Start with ``env`` (KDTREE_PARITY_* settings); ``wait`` until /health answers 200.
    ``prefix`` runs it under another command (e.g. ``unshare --pid``: a container's pids)."""

    def __init__(self, env: dict[str, str], log_path: Path, prefix: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        with log_path.open("wb") as log:
            command = [sys.executable, "-m", "kdtree_parity.cli", "serve", "--port", str(self.port)]
            self.proc = subprocess.Popen(
                [*prefix, *command],
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"parity service did not start:\n{self.log()}"
            time.sleep(0.2)

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
