"""The installed kdtree-inference version, as every CLI of the package prints it (``--version``)."""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "kdtree-inference"


def package_version(distribution: str = DISTRIBUTION) -> str:
    """``distribution``'s installed version, or ``not installed``."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def version_line(prog: str) -> str:
    return f"{prog} {package_version()}"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``PROG VERSION`` and exit 0."""
    parser.add_argument("--version", action="version", version=version_line(parser.prog))
