"""``kdtree-parity report RUN_ID``: render a stored run's report (exit status: the run's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kdtree_parity.commands.options import (
    EXIT,
    Refusal,
    add_db,
    add_resolution,
    console,
    open_store_read_only,
    print_verdict,
    refusing,
    resolution_table,
)
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.report import build_report, render_with_resolution
from kdtree_parity.report import write_report_files as write_reports
from kdtree_parity.settings import ParitySettings
from kdtree_parity.untrusted_text import for_terminal

HELP = "render a stored run's report"


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    parser.add_argument("run_id")
    parser.add_argument(
        "--format",
        choices=("md", "json", "html", "files"),
        default="md",
        help="print md/json/html to stdout, or write all three files",
    )
    parser.add_argument("--out", default=settings.out, help="where 'files' writes")
    add_resolution(parser, "resolution table to print in the md/html report")
    add_db(parser, settings)


@refusing
def run(args: argparse.Namespace) -> int:
    resolution = resolution_table(args.resolution)
    store = open_store_read_only(args.db)
    try:
        try:
            report = build_report(store, args.run_id)
        except KeyError:
            console.print(
                f"[red]no run {for_terminal(args.run_id)} in {for_terminal(args.db)}",
                highlight=False,
            )
            return ExitCode.ERROR
        if args.format == "files":
            try:
                paths = write_reports(store, args.run_id, Path(args.out), resolution=resolution)
            except OSError as exc:
                raise Refusal(f"cannot write reports to {args.out}: {exc}") from None
            print_verdict(report, paths)
        else:
            sys.stdout.write(render_with_resolution(report, args.format, resolution))
        return EXIT[report.run.status]
    finally:
        store.close()
