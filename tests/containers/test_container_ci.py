"""scripts/container_ci.sh itself: what an earlier run killed outright left behind is cleared (its
daemon's state, its namespace, a build's staged layers), and a disk too small for the daemon's
copy of the images is named before any daemon, registry or namespace of this run is started.

The script runs for real (root, podman and the images this run built); only its state directory
is put on a 16 MiB tmpfs, mounted in a private mount namespace so it vanishes with the command.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from container_support import missing, run

pytestmark = pytest.mark.slow


def _netns() -> set[str]:
    return set(run("ip", "netns", "list").stdout.split())


def test_a_disk_without_room_for_the_images_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    if os.getuid() != 0:
        missing("mounting a small disk for the script needs root")
    for command in ("unshare", "podman", "ip"):
        if shutil.which(command) is None:
            missing(f"no {command} on PATH")
    # An earlier run, killed before its teardown: its pid is gone, its state and namespace stay.
    exited = subprocess.Popen(["true"])
    exited.wait()
    stale_run, stale_netns = f"run-{exited.pid}", f"kdtree-ci-{exited.pid}"
    run("ip", "netns", "add", stale_netns)
    # ... and the command it was running, still in that namespace.
    leftover = subprocess.Popen(["ip", "netns", "exec", stale_netns, "sleep", "300"])
    try:
        deadline = time.monotonic() + 30
        while str(leftover.pid) not in run("ip", "netns", "pids", stale_netns).stdout.split():
            assert time.monotonic() < deadline, "the leftover command never entered its namespace"
            time.sleep(0.1)
        # A build killed while it committed a layer: buildah's staged copies of it (GBs) are left
        # in the image-copy directory; pip's build cache mount beside them is kept.
        staging = Path(os.environ.get("KDTREE_CI_CACHE", "/var/cache/kdtree-ci")) / "tmp"
        staged = staging / "buildah123456" / "sha256:0123"
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_bytes(b"a layer's diff")
        pip_cache = staging / "buildah-cache" / "kept-by-the-test"
        pip_cache.parent.mkdir(parents=True, exist_ok=True)
        pip_cache.write_bytes(b"a cached wheel")
        before = _netns()
        small = tmp_path / "small"
        small.mkdir()
        state = small / "state"
        script = (
            f'mount -t tmpfs -o size=16M tmpfs "{small}" '
            f'&& mkdir -p "{state}/{stale_run}/docker" '
            f'&& head -c 4M /dev/zero > "{state}/{stale_run}/docker/layer" '
            f"&& {{ scripts/container_ci.sh run true; rc=$?; echo left in state: $(ls -A {state}); exit $rc; }}"
        )
        result = run(
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            env={"KDTREE_CI_STATE": str(state)},
            check=False,
        )
        after = _netns()
    finally:
        leftover.kill()
        leftover_status = leftover.wait()
        run("ip", "netns", "delete", stale_netns, check=False)
    assert result.returncode == 2, result.stderr[-4000:]
    assert not staged.parent.exists(), "a killed build's staged layers should be gone"
    assert pip_cache.read_bytes() == b"a cached wheel"
    pip_cache.unlink()
    assert f"clearing {state}/{stale_run} and namespace {stale_netns}" in result.stderr
    [listing] = [line for line in result.stdout.splitlines() if line.startswith("left in state:")]
    assert listing.split() == ["left", "in", "state:"], "the stale run's directory should be gone"
    assert after == before - {stale_netns}
    assert f"stopping leftover process {leftover.pid} in {stale_netns}: sleep 300" in result.stderr
    assert leftover_status == -signal.SIGTERM, "the script should have stopped it with TERM"
    refusal = re.search(
        r"container_ci: (\S+) has (\d+\.\d) GB free and the run needs about (\d+\.\d) GB "
        r"\(the loaded images' (\d+\.\d) GB, then the largest one's (\d+\.\d) GB",
        result.stderr,
    )
    assert refusal, result.stderr[-4000:]
    where, free, need, images, largest = refusal.groups()
    assert where == str(state)
    assert float(free) < 0.1
    # The demo image alone carries torch: the estimate comes from the real images' sizes.
    assert float(images) > 0.2
    assert float(images) >= float(largest) > 0.2
    assert float(need) >= float(images) + float(largest)
    # Refused up front: no daemon of this run was started and no namespace made.
    assert "dockerd in" not in result.stderr
    assert "network namespace" not in result.stderr
    assert not any(small.iterdir()), "the tmpfs should have gone with its mount namespace"
