"""``kdtree-parity``: run the gate, render a stored run's report, list runs, serve the service.

Exit codes of ``run`` (and ``report``): 0 pass, 1 fail, 2 could not decide (errors, too few
prompts, an interrupted run, bad input).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kdtree_parity.config import env_default
from kdtree_parity.corpus import CorpusError, load_corpus
from kdtree_parity.policy import PolicyError, load_policy
from kdtree_parity.report import build_report, render_html, render_markdown, report_json
from kdtree_parity.report import write_report_files as write_reports
from kdtree_parity.report.schema import Report
from kdtree_parity.results import PromptResult
from kdtree_parity.runner import (
    ProgressCallback,
    Targets,
    corpus_too_small,
    execute_run,
    start_run,
)
from kdtree_parity.store import Store

EXIT = {"passed": 0, "failed": 1, "error": 2, "interrupted": 2, "running": 2}
console = Console(stderr=True, soft_wrap=True)


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=env_default("DB"), help="SQLite file (env KDTREE_PARITY_DB)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdtree-parity",
        description="Replay a corpus against a baseline and a candidate inference server, compare "
        "greedy outputs token by token against A/A noise, and decide by a policy.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the gate (exit 0 pass, 1 fail, 2 could not decide)")
    run.add_argument("--baseline", default=env_default("BASELINE_URL"), help="baseline URL")
    run.add_argument("--candidate", default=env_default("CANDIDATE_URL"), help="candidate URL")
    run.add_argument(
        "--replica",
        default=env_default("REPLICA_URL"),
        help="a second baseline server for A/A noise; without one the baseline is replayed twice",
    )
    for role in ("baseline", "candidate", "replica"):
        run.add_argument(
            f"--{role}-image",
            default=env_default(f"{role.upper()}_IMAGE"),
            help=f"{role} image digest or reference, recorded in the report",
        )
    run.add_argument("--corpus", default=env_default("CORPUS"), help="JSONL path or default|short")
    run.add_argument("--policy", default=env_default("POLICY"), help="YAML path or default|short")
    run.add_argument("--out", default=env_default("OUT"), help="reports go to OUT/RUN_ID/")
    run.add_argument("--resume", metavar="RUN_ID", help="continue an interrupted or errored run")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_db(run)

    report = sub.add_parser("report", help="render a stored run's report")
    report.add_argument("run_id")
    report.add_argument("--format", choices=("md", "json", "html", "files"), default="md",
                        help="print md/json/html to stdout, or write all three files")  # fmt: skip
    report.add_argument("--out", default=env_default("OUT"), help="where 'files' writes")
    _add_db(report)

    lst = sub.add_parser("list", help="list stored runs, newest first")
    lst.add_argument("--limit", type=int, default=20)
    _add_db(lst)

    sub.add_parser("schema", help="print the JSON Schema of report.json")

    serve = sub.add_parser(
        "serve", help="run the HTTP service (configuration from the environment)"
    )
    serve.add_argument("--host", default=env_default("HOST"))
    serve.add_argument("--port", type=int, default=int(env_default("PORT")))
    return parser


def _print_verdict(report: Report, paths: dict[str, Path] | None) -> None:
    v = report.verdict
    colour = {"pass": "green", "fail": "red", "error": "yellow"}[v.status]
    console.print(f"[bold {colour}]verdict: {v.status.upper()}[/] (run {report.run.id})")
    for r in v.reasons:
        mark = {"pass": "[green]ok[/]", "fail": "[red]FAIL[/]", "undecided": "[yellow]??[/]"}
        console.print(f"  {mark[r.outcome]} {r.rule}: {r.message}", highlight=False)
    if paths:
        console.print(f"report: {paths['html']}  (also {paths['json'].name}, {paths['md'].name})")


def _cmd_run(args: argparse.Namespace) -> int:
    store = Store(args.db)
    try:
        if args.resume:
            try:
                record = store.claim_for_resume(args.resume)
            except (KeyError, ValueError) as exc:
                console.print(f"[red]cannot resume {args.resume}: {exc}")
                return 2
            run_id, total = record.id, record.prompts_total
            console.print(f"resuming run {run_id}: {record.prompts_ok}/{total} prompts done")
        else:
            try:
                corpus = load_corpus(args.corpus)
                policy = load_policy(args.policy)
            except (CorpusError, PolicyError) as exc:
                console.print(f"[red]{exc}", highlight=False)
                return 2
            if not args.baseline or not args.candidate:
                console.print("[red]--baseline and --candidate are required")
                return 2
            too_small = corpus_too_small(corpus, policy)
            if too_small:
                console.print(f"[red]{too_small}", highlight=False)
                return 2
            run_id = start_run(
                store,
                corpus,
                policy,
                Targets(
                    args.baseline,
                    args.candidate,
                    args.replica or None,
                    args.baseline_image or None,
                    args.candidate_image or None,
                    args.replica_image or None,
                ),
                out_dir=str(Path(args.out).resolve()),
            )
            total = len(corpus)
            console.print(f"run {run_id}: {total} prompts, corpus {corpus.source}")
        counts = {"hard": 0, "near_tie": 0, "errors": 0}
        with Progress(
            TextColumn("[bold]replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            disable=args.no_progress,
        ) as bar:
            task = bar.add_task("", total=total)

            def progress(done: int, _total: int, result: PromptResult | None) -> None:
                if result is not None:
                    counts["errors"] += result.has_error
                    if result.candidate is not None and result.candidate.divergence_class:
                        counts[result.candidate.divergence_class] += 1
                bar.update(
                    task,
                    completed=done,
                    description=f"hard {counts['hard']} · near-tie {counts['near_tie']} · "
                    f"errors {counts['errors']}",
                )

            try:
                asyncio.run(_run_with_signals(store, run_id, progress))
            except KeyboardInterrupt:
                console.print("[yellow]interrupted: the run is recorded as interrupted (--resume)")
            except Exception as exc:  # recorded as an error run by execute_run; say why, exit 2
                console.print(f"[red]run failed: {type(exc).__name__}: {exc}", highlight=False)
        record = store.get_run(run_id)
        paths = None
        if record.out_dir:
            paths = write_reports(store, run_id, Path(record.out_dir))
        _print_verdict(build_report(store, run_id), paths)
        return EXIT[record.status]
    finally:
        store.close()


async def _run_with_signals(store: Store, run_id: str, progress: ProgressCallback) -> None:
    """SIGTERM cancels the run like Ctrl-C, so it is recorded as interrupted, not left running."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await execute_run(store, run_id, progress=progress, write_reports=False)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


def _cmd_report(args: argparse.Namespace) -> int:
    store = Store(args.db)
    try:
        try:
            report = build_report(store, args.run_id)
        except KeyError:
            console.print(f"[red]no run {args.run_id} in {args.db}")
            return 2
        if args.format == "files":
            _print_verdict(report, write_reports(store, args.run_id, Path(args.out)))
        else:
            render = {"md": render_markdown, "json": report_json, "html": render_html}
            sys.stdout.write(render[args.format](report))
        return EXIT[report.run.status]
    finally:
        store.close()


def _cmd_list(args: argparse.Namespace) -> int:
    """A table on a terminal; tab-separated lines (one run each) when piped, for scripts."""
    store = Store(args.db)
    try:
        columns = ("run", "status", "started (UTC)", "prompts ok", "baseline", "candidate")
        rows = [
            (
                r.id,
                r.status,
                datetime.fromtimestamp(r.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S"),
                f"{r.prompts_ok}/{r.prompts_total}",
                r.targets.get("baseline", ("",))[0],
                r.targets.get("candidate", ("",))[0],
            )
            for r in store.list_runs(args.limit)
        ]
        if sys.stdout.isatty():
            table = Table(*columns)
            for row in rows:
                table.add_row(*row)
            Console().print(table)
        else:
            for row in [columns, *rows]:
                print("\t".join(row))
        return 0
    finally:
        store.close()


def _cmd_schema(_: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(Report.model_json_schema(), indent=1) + "\n")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn  # the service's imports are only paid for by `serve`

    from kdtree_parity.service import ServiceSettings, create_app

    settings = ServiceSettings.from_env(os.environ)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {
        "run": _cmd_run,
        "report": _cmd_report,
        "list": _cmd_list,
        "schema": _cmd_schema,
        "serve": _cmd_serve,
    }[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
