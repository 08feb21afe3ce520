"""Every console script the packages declare, and the promotion CLI, answer ``--version`` with
their package's installed version and exit 0, starting nothing."""

from __future__ import annotations

import importlib
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = {
    "kdtree-inference": ROOT / "services" / "inference" / "pyproject.toml",
    "kdtree-parity": ROOT / "services" / "parity" / "pyproject.toml",
    "kdtree-verify": ROOT / "kernel" / "pyproject.toml",
}


def declared_scripts() -> list[tuple[str, str, str]]:
    """(script name, "module:function", distribution) for every [project.scripts] entry."""
    found = []
    for distribution, path in PYPROJECTS.items():
        project = tomllib.loads(path.read_text())["project"]
        found += [
            (name, target, distribution) for name, target in project.get("scripts", {}).items()
        ]
    return found


CLIS = [
    *declared_scripts(),
    ("python -m kdtree_parity.promote", "kdtree_parity.promote.cli:main", "kdtree-parity"),
]


def test_every_declared_script_is_covered() -> None:
    names = {name for name, _, _ in declared_scripts()}
    assert names == {"kdtree-engine", "kdtree-serve", "kdtree-selfcheck", "kdtree-parity"}


@pytest.mark.parametrize(("prog", "target", "distribution"), CLIS, ids=[c[0] for c in CLIS])
def test_version_flag_prints_the_package_version(
    prog: str, target: str, distribution: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module, function = target.split(":")
    main = getattr(importlib.import_module(module), function)
    try:
        status = main(["--version"])
    except SystemExit as exit_:  # argparse's version action
        status = exit_.code
    assert status == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"{prog} {version(distribution)}"), out
    if prog == "kdtree-serve":
        assert out.endswith(f"(sglang {version('sglang')})")
