"""The installed kdtree-parity version, as every CLI of the package prints it (``--version``)."""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "kdtree-parity"


def package_version() -> str:
    """The installed version, or ``not installed``."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "not installed"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``PROG VERSION`` and exit 0."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {package_version()}")
