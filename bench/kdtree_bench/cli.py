"""Command-line pieces that the bench tools share: ``NAME=PATH`` arguments and a table printed
and, optionally, written to a file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def name_and_path(form: str) -> Callable[[str], tuple[str, Path]]:
    """An argparse ``type`` for ``NAME=PATH`` arguments; ``form`` is how the error spells it
    (e.g. ``"RUN=SPEED_JSON"``)."""

    def parse(text: str) -> tuple[str, Path]:
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}")
        return name, Path(path)

    return parse


def emit_table(table: str, out: Path | None) -> None:
    """Print a Markdown table, and write it to ``out`` too where one is given."""
    print(table, end="")
    if out is not None:
        out.write_text(table)
