"""scripts/container_ci.sh itself: a disk too small for the daemon's copy of the images is named
before any daemon, registry or namespace is started.

The script runs for real (root, podman and the images this run built); only its state directory
is put on a 16 MiB tmpfs, mounted in a private mount namespace so it vanishes with the command.
"""

from __future__ import annotations

import os
import re
import shutil
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
    before = _netns()
    small = tmp_path / "small"
    small.mkdir()
    result = run(
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs -o size=16M tmpfs "{small}" && exec scripts/container_ci.sh run true',
        env={"KDTREE_CI_STATE": str(small / "state")},
        check=False,
    )
    assert result.returncode == 2, result.stderr[-4000:]
    refusal = re.search(
        r"container_ci: (\S+) has (\d+\.\d) GB free and the run needs about (\d+\.\d) GB "
        r"\(twice the images' (\d+\.\d) GB",
        result.stderr,
    )
    assert refusal, result.stderr[-4000:]
    where, free, need, images = refusal.groups()
    assert where == str(small / "state")
    assert float(free) < 0.1
    # The demo image alone carries torch: the estimate comes from the real images' sizes.
    assert float(images) > 0.2
    assert float(need) >= 2 * float(images)
    # Refused up front: no daemon was started, no namespace was made or left behind.
    assert "==> " in result.stderr and "dockerd in" not in result.stderr
    assert "network namespace" not in result.stderr
    assert _netns() == before
    assert not any(small.iterdir()), "the tmpfs should have gone with its mount namespace"
