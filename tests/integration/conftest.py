"""Fixtures that start REAL engine servers (subprocesses on loopback) for integration tests.

``reference_server(**cli_options) -> base_url`` spawns ``python -m kdtree_inference.engine`` on a
free 127.0.0.1 port, waits for ``GET /health`` to answer 200 and kills the server at teardown.
Keyword arguments become CLI flags (``fault_layer=1`` -> ``--fault-layer 1``; True -> bare flag;
None/False -> omitted). Reserved keywords: ``env`` (extra environment, e.g.
``{"KDTREE_VERIFY": "on"}``), ``wait_ready`` (False: return once the port answers at all, to
observe the not-ready state), ``timeout`` (seconds to wait, default 120).
``reference_server_module`` is the same factory with module scope, for a server shared by a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdtree_inference.engine.launch import EngineProcess


class ServerFactory:
    """Starts engine servers and stops every one of them in ``close``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[EngineProcess] = []

    def __call__(
        self,
        *,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        timeout: float = 120.0,
        **cli_options: object,
    ) -> str:
        server = EngineProcess(self.log_dir / f"engine-{len(self.started)}.log", env, **cli_options)
        self.started.append(server)
        server.wait(timeout, ready=wait_ready)
        return server.url

    def close(self) -> None:
        for server in self.started:
            server.stop()


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
