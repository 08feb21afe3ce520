"""The kdtree-verify wheel as a user installs it: it carries the CUDA sources, and an installed
package (no checkout anywhere on the path) builds its extension from them, into a per-user cache
rather than into site-packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNEL = REPO / "kernel"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Build from a copy so the checkout gets no build/ or egg-info from this test.
    source = tmp_path_factory.mktemp("src") / "kernel"
    shutil.copytree(KERNEL, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(source),
            "-w",
            str(out),
        ],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("kdtree_verify-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    return target


def _run_installed(target: Path, code: str, cache: Path, timeout: float = 60) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(target),
        "XDG_CACHE_HOME": str(cache),
        "KDTREE_BUILD_WITHOUT_GPU": "1",
        "KDTREE_CUDA_ARCHS": "90",
    }
    env.pop("KDTREE_BUILD_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=cache,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_wheel_carries_every_cuda_source(wheel) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p.name for p in (KERNEL / "csrc").iterdir() if p.is_file())
    assert sources, "kernel/csrc is empty"
    missing = [s for s in sources if f"kdtree_verify/csrc/{s}" not in names]
    assert not missing, f"the wheel lacks {missing}"


def test_installed_package_finds_its_sources_and_a_user_cache(installed, tmp_path) -> None:
    out = _run_installed(
        installed,
        "import kdtree_verify, kdtree_verify._build as b;"
        "print(kdtree_verify.__file__); print(b.CSRC_DIR); print(b.IN_CHECKOUT); print(b.build_dir())",
        tmp_path,
    )
    module, csrc, in_checkout, build = out.split()
    assert Path(module).is_relative_to(installed), "imported the checkout, not the wheel"
    assert Path(csrc) == installed / "kdtree_verify" / "csrc"
    assert in_checkout == "False"
    assert Path(build).is_relative_to(tmp_path / "kdtree-verify")


@pytest.mark.slow
def test_installed_package_builds_its_extension(installed, tmp_path) -> None:
    out = _run_installed(
        installed, "import kdtree_verify._build as b; print(b.load().__file__)", tmp_path, 900
    )
    built = Path(out.split()[-1])
    assert built.is_file() and built.is_relative_to(tmp_path / "kdtree-verify")
