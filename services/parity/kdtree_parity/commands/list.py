"""``kdtree-parity list``: stored runs, newest first."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from kdtree_parity.commands.options import add_db, open_store_read_only, refusing
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.settings import ParitySettings
from kdtree_parity.store import RunRecord
from kdtree_parity.untrusted_text import for_terminal, printable

HELP = "list stored runs, newest first"
COLUMNS = ("run", "status", "started (UTC)", "prompts ok", "baseline", "candidate")


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    parser.add_argument("--limit", type=int, default=20)
    add_db(parser, settings)


def row(record: RunRecord) -> tuple[str, ...]:
    """One run's cells, in COLUMNS' order."""
    return (
        record.id,
        record.status,
        datetime.fromtimestamp(record.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S"),
        f"{record.prompts_ok}/{record.prompts_total}",
        record.targets.get("baseline", ("",))[0],
        record.targets.get("candidate", ("",))[0],
    )


@refusing
def run(args: argparse.Namespace) -> int:
    """A table on a terminal; tab-separated lines (one run each) when piped, for scripts."""
    store = open_store_read_only(args.db)
    try:
        rows = [row(r) for r in store.list_runs(args.limit)]
        if sys.stdout.isatty():
            table = Table(*COLUMNS)
            for cells in rows:
                table.add_row(*map(for_terminal, cells))
            Console().print(table)
        else:
            for cells in [COLUMNS, *rows]:
                print("\t".join(printable(cell) for cell in cells))
        return ExitCode.PASSED
    finally:
        store.close()
