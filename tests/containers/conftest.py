"""Container tests: the images, compose.yaml and the promotion CLI against a real Docker engine.

Nothing here is a stand-in. ``scripts/container_ci.sh run CMD`` provides the engine (CI runs the
suite that way through .ci/run): dockerd reachable through DOCKER_HOST, the compose plugin in
DOCKER_CONFIG, a local registry at KDTREE_CI_REGISTRY, kdtree/parity:latest and kdtree/demo:latest
built from this checkout's Dockerfile and loaded there, and localhost/kdtree/inference:latest in
podman's storage (built there, pushed to the registry, run with podman). Everything runs inside the script's
network namespace, which has only loopback.

Without an engine these tests are skipped with the reason; under CI=true a missing engine fails
them instead, so CI can never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from container_support import (
    IMAGES,
    INFERENCE_IMAGE,
    UNPRIVILEGED_ID,
    Invoker,
    docker,
    missing,
    podman,
    run,
)


@pytest.fixture(scope="session")
def compose_cli() -> None:
    """The docker CLI with Compose v2 (enough for `docker compose config`)."""
    if shutil.which("docker") is None:
        missing("no docker CLI on PATH")
    version = run("docker", "compose", "version", "--short", check=False, timeout=60)
    if version.returncode != 0:
        first_line = (version.stderr.strip().splitlines() or ["no output"])[0]
        missing(f"no Compose v2 plugin (docker compose version: {first_line})")


@pytest.fixture(scope="session")
def engine(compose_cli: None) -> None:
    """A Docker daemon that answers, with the parity and demo images loaded."""
    info = run("docker", "info", "--format", "{{.ServerVersion}}", check=False, timeout=60)
    if info.returncode != 0:
        first_line = (info.stderr.strip().splitlines() or ["no output"])[0]
        missing(f"no Docker daemon answers ({first_line})")
    absent = [ref for ref in IMAGES if docker("image", "inspect", ref, check=False).returncode]
    if absent:
        missing(f"the images {', '.join(absent)} are not built")


@pytest.fixture(scope="session")
def inference_image() -> str:
    """The inference image in podman's storage (scripts/container_ci.sh builds it unless
    KDTREE_CI_INFERENCE_IMAGE=0; then these tests do not run, and nothing counts them)."""
    if os.environ.get("KDTREE_CI_INFERENCE_IMAGE", "1") == "0":
        pytest.skip(
            "KDTREE_CI_INFERENCE_IMAGE=0: the inference image was left out of this run "
            "(docs/operations.md, 'CI')"
        )
    if shutil.which("podman") is None:
        missing("no podman on PATH")
    if podman("image", "exists", INFERENCE_IMAGE, check=False).returncode:
        missing(f"the image {INFERENCE_IMAGE} is not built (scripts/container_ci.sh images)")
    return INFERENCE_IMAGE


@pytest.fixture(scope="session")
def registry() -> str:
    """host:port of the local registry (the daemon's pushes, podman's push of the inference
    image); the inference image's tests need it without the daemon's images."""
    address = os.environ.get("KDTREE_CI_REGISTRY", "")
    if not address:
        missing("KDTREE_CI_REGISTRY names no local registry")
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=10):
            pass
    except OSError as exc:
        missing(f"the registry at {address} does not answer ({exc})")
    return address


@pytest.fixture
def invoker() -> Iterator[Invoker]:
    # Not under tmp_path: pytest makes that 0700 for root, and the user must reach it.
    home = Path(tempfile.mkdtemp(prefix="kdtree-containers-"))
    home.chmod(0o755)
    uid, gid = (
        (UNPRIVILEGED_ID, UNPRIVILEGED_ID) if os.getuid() == 0 else (os.getuid(), os.getgid())
    )
    os.chown(home, uid, gid)
    yield Invoker(uid, gid, home)
    shutil.rmtree(home, ignore_errors=True)
