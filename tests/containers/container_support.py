"""Helpers of the container tests (conftest.py says what they run against): real commands,
compose on the checkout's compose.yaml, the invoking user, the sidecar's reports."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
IMAGES = ("kdtree/parity:latest", "kdtree/demo:latest")
# The inference image stays in podman's storage, where scripts/container_ci.sh built it (a copy in
# dockerd would need its ~12 GB again); podman runs it.
INFERENCE_IMAGE = "localhost/kdtree/inference:latest"
HOW = "run the suite through scripts/container_ci.sh run make test (root; see docs/operations.md)"
# A uid that no image uses (the images run as 10001), standing for the invoking user when the
# tests run as root: a report owned by it can only have been written as the invoking user.
UNPRIVILEGED_ID = 4242


def _must_run() -> bool:
    """Under CI=true or scripts/container_ci.sh (KDTREE_CONTAINER_CI=1) nothing may be missing."""
    return any(
        os.environ.get(name, "").strip().lower() in {"1", "true", "yes"}
        for name in ("CI", "KDTREE_CONTAINER_CI")
    )


def missing(reason: str) -> None:
    """Skip on a plain `make test`; fail under CI=true or scripts/container_ci.sh, so that the CI
    entry point can never pass because the engine was absent."""
    if _must_run():
        pytest.fail(f"{reason}, and the container tests must run here: {HOW}", pytrace=False)
    pytest.skip(f"{reason}: {HOW}")


def run(
    *command: str, env: Mapping[str, str] | None = None, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess:
    """A command with its output kept; a failure shows both streams."""
    result = subprocess.run(
        command,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
        )
    return result


def docker(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return run("docker", *args, **kwargs)


def podman(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return run("podman", *args, **kwargs)


def inspect(ref: str, template: str, engine: str = "docker") -> Any:
    return json.loads(
        run(engine, "image", "inspect", "--format", f"{{{{json {template}}}}}", ref).stdout
    )


@dataclass
class Invoker:
    """Runs commands as the invoking user: this one, or an unprivileged uid when this is root."""

    uid: int
    gid: int
    home: Path

    def command(self, *argv: str) -> list[str]:
        if os.getuid() != 0:
            return list(argv)
        # The daemon's socket group, so the unprivileged user can reach dockerd as a member of
        # the docker group would.
        socket = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix(
            "unix://"
        )
        group = os.stat(socket).st_gid
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            f"--groups={group}",
            "--",
            *argv,
        ]

    def directory(self, name: str) -> Path:
        path = self.home / name
        path.mkdir()
        os.chown(path, self.uid, self.gid)
        return path


def compose_command(project: str, *args: str, files: Sequence[Path] = ()) -> list[str]:
    """`docker compose` on the checkout's compose.yaml (plus overrides) under its own project."""
    extra = [arg for path in files for arg in ("--file", str(path))]
    return [
        "docker",
        "compose",
        "--project-name",
        project,
        "--file",
        str(COMPOSE_FILE),
        *extra,
        *args,
    ]


def compose_down(project: str, *profiles: str) -> None:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    run(
        *compose_command(project, *flags, "down", "--remove-orphans", "--timeout", "5"), check=False
    )


def read_report(out_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The sidecar writes OUT/<its run id>/report.json; one run, so one report."""
    found = sorted(out_dir.glob("*/report.json"))
    assert len(found) == 1, f"expected one report.json under {out_dir}, found {found}"
    return found[0], json.loads(found[0].read_text())


def failing_reasons(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report["verdict"]["reasons"] if r.get("outcome") != "pass"]
