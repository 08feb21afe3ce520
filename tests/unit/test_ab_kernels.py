"""bench/ab_kernels.sh's dev-machine half: ``prepare`` copies kernel/ at a git ref into ab/<name>,
and ``run`` refuses clearly when there is nothing to compare (its GPU half runs on the GPU
machine; its results are under bench/results/gpu_run1[2-6]*)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "ab_kernels.sh"


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    if not (REPO / ".git").exists():
        pytest.fail("these tests need the repository's git checkout")
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True)
    return dest


def _ab(clone: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=clone, capture_output=True, text=True,
        env={**os.environ, **env}, timeout=120,
    )  # fmt: skip


def test_prepare_copies_the_kernel_at_a_ref(clone: Path) -> None:
    subprocess.run(["git", "-C", str(clone), "branch", "experiment/x+y"], check=True)
    done = _ab(clone, "prepare", "HEAD", "experiment/x+y")
    assert done.returncode == 0, done.stderr
    for name in ("HEAD", "experiment_x_y"):
        copied = clone / "ab" / name / "kernel"
        assert (copied / "csrc" / "verify_kernel.cu").is_file()
        assert (copied / "kdtree_verify" / "op.py").is_file()
    assert (clone / "ab/HEAD/kernel/csrc/verify_kernel.cu").read_bytes() == (
        clone / "kernel/csrc/verify_kernel.cu"
    ).read_bytes()
    assert "ab/experiment_x_y <- experiment/x+y" in done.stdout


def test_prepare_fails_on_an_unknown_ref(clone: Path) -> None:
    done = _ab(clone, "prepare", "no-such-ref")
    assert done.returncode != 0


def test_run_without_variants_says_what_to_do(clone: Path, tmp_path: Path) -> None:
    done = _ab(clone, "run", OUT=str(tmp_path / "out"), KDTREE_CUDA_ARCHS="90")
    assert done.returncode == 2
    assert "run prepare first" in done.stderr


def test_usage_errors() -> None:
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
