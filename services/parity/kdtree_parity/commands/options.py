"""What the ``kdtree-parity`` commands share: the two consoles, the exit status of a run's
status, refusals (one line on stderr, exit 2), the ``--db`` option and opening the store, the
``--resolution`` table, and printing a verdict."""

from __future__ import annotations

import argparse
import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.report.resolution import ResolutionError, ResolutionTable, load_resolution
from kdtree_parity.report.schema import Report
from kdtree_parity.settings import ParitySettings
from kdtree_parity.store import RunStatus, Store, StoreError
from kdtree_parity.untrusted_text import for_terminal

EXIT: dict[RunStatus, ExitCode] = {
    "passed": ExitCode.PASSED,
    "failed": ExitCode.FAILED,
    "error": ExitCode.ERROR,
    "interrupted": ExitCode.ERROR,
    "running": ExitCode.ERROR,
}
console = Console(stderr=True, soft_wrap=True)  # progress, logs, errors
results = Console(soft_wrap=True)  # the verdict and where the report is: what a script reads


class Refusal(Exception):
    """A reason to stop before anything is replayed: one line on stderr, exit 2."""


def refusing(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command`` with a Refusal printed (red, on stderr) and turned into exit 2."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except Refusal as exc:
            console.print(f"[red]{for_terminal(exc, keep_newlines=True)}", highlight=False)
            return ExitCode.ERROR

    return run


def add_db(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    parser.add_argument("--db", default=settings.db, help="SQLite file (env KDTREE_PARITY_DB)")


def add_resolution(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--resolution", default=None, help=help_text)


def open_store(db: str, lease_s: float) -> Store:
    """The run database, writable (Refusal when it cannot be used)."""
    try:
        store = Store(db, lease_s=lease_s)
    except (OSError, sqlite3.Error, StoreError) as exc:
        raise Refusal(f"cannot use the run database {db}: {exc}") from None
    try:
        store.check_writable()
    except sqlite3.Error as exc:
        store.close()
        raise Refusal(f"cannot use the run database {db}: {exc}") from None
    return store


def open_store_read_only(db: str) -> Store:
    """For list and report: nothing is created or written (a typo is not a new database)."""
    try:
        return Store(db, read_only=True)
    except (OSError, sqlite3.Error, StoreError) as exc:
        raise Refusal(f"cannot read the run database {db}: {exc}") from None


def resolution_table(path: str | None) -> ResolutionTable | None:
    """The ``--resolution`` table, or None when none was given (Refusal when it is unusable)."""
    if not path:
        return None
    try:
        return load_resolution(path)
    except ResolutionError as exc:
        raise Refusal(str(exc)) from None


def print_reasons(verdict: Any, heading: str) -> None:
    """A verdict (the gate's, or a report's model of it) and its reasons, one line each."""
    colour = {"pass": "green", "fail": "red", "error": "yellow"}[verdict.status]
    results.print(
        f"[bold {colour}]verdict: {verdict.status.upper()}[/] ({for_terminal(heading)})",
        highlight=False,
    )
    for r in verdict.reasons:
        mark = {"pass": "[green]ok[/]", "fail": "[red]FAIL[/]", "undecided": "[yellow]??[/]"}
        results.print(
            f"  {mark[r.outcome]} {for_terminal(r.rule)}: {for_terminal(r.message)}",
            highlight=False,
        )


def print_verdict(report: Report, paths: dict[str, Path] | None) -> None:
    """A run's verdict, the identity changes its resume accepted, and where its reports are."""
    print_reasons(report.verdict, f"run {report.run.id}")
    for change in report.identity_changes:
        results.print(
            f"  [yellow]!![/] resumed against a changed {change.role} (accepted): "
            + for_terminal("; ".join(change.differences)),
            highlight=False,
        )
    if paths:
        results.print(
            f"report: {for_terminal(paths['html'])}  (also {for_terminal(paths['json'].name)}, "
            f"{for_terminal(paths['md'].name)})",
            highlight=False,
        )
