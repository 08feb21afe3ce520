"""bench/ab_kernels.sh's dev-machine half: ``prepare`` copies kernel/ at a git ref into ab/<name>,
``with`` runs a command against one variant's package, and ``run`` refuses clearly when there is
nothing to compare (its GPU half runs on the GPU machine; docs/kernel-journal.md lists the runs
that used it)."""

from __future__ import annotations

import os
import subprocess
import sys
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
        ["bash", str(SCRIPT), *args],
        cwd=clone,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


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
    # The variant's GPU tests come with it, so a variant is tested against its own test file.
    assert (clone / "ab/HEAD/tests/gpu/test_kernel.py").read_bytes() == (
        clone / "tests/gpu/test_kernel.py"
    ).read_bytes()
    assert "ab/experiment_x_y <- experiment/x+y" in done.stdout


def test_prepare_fails_on_an_unknown_ref(clone: Path) -> None:
    done = _ab(clone, "prepare", "no-such-ref")
    assert done.returncode != 0


def test_run_without_variants_says_what_to_do(clone: Path, tmp_path: Path) -> None:
    done = _ab(clone, "run", OUT=str(tmp_path / "out"), KDTREE_CUDA_ARCHS="90")
    assert done.returncode == 2
    assert "run prepare first" in done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AB_REPEATS": "0"}, "AB_REPEATS must be a positive integer"),
        ({"AB_REPEATS": "two"}, "AB_REPEATS must be a positive integer"),
        ({"AB_TEST_VARIANTS": "HEAD nope"}, "AB_TEST_VARIANTS: no variant ab/nope"),
    ],
)
def test_run_refuses_bad_settings_before_touching_a_gpu(
    clone: Path, tmp_path: Path, env: dict[str, str], message: str
) -> None:
    assert _ab(clone, "prepare", "HEAD").returncode == 0
    done = _ab(clone, "run", OUT=str(tmp_path / "out"), KDTREE_CUDA_ARCHS="90", **env)
    assert done.returncode == 2
    assert message in done.stderr
    assert "== HEAD" not in done.stdout  # nothing was built


def test_with_runs_a_command_against_the_variant(clone: Path) -> None:
    assert _ab(clone, "prepare", "HEAD").returncode == 0
    probe = "import os, kdtree_verify; print(kdtree_verify.__file__); print(os.environ['KDTREE_BUILD_DIR'])"
    done = _ab(clone, "with", "HEAD", sys.executable, "-c", probe)
    assert done.returncode == 0, done.stderr
    package, build_dir = done.stdout.split()
    assert Path(package).resolve().is_relative_to((clone / "ab" / "HEAD" / "kernel").resolve())
    assert build_dir == "/tmp/ab-build/HEAD"


def test_with_refuses_an_unknown_variant_and_keeps_the_exit_status(clone: Path) -> None:
    done = _ab(clone, "with", "nope", "true")
    assert done.returncode == 2 and "no variant ab/nope" in done.stderr
    assert _ab(clone, "prepare", "HEAD").returncode == 0
    assert _ab(clone, "with", "HEAD", "sh", "-c", "exit 7").returncode == 7


def test_usage_errors() -> None:
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
