"""``kdtree-parity``: run the gate, render a stored run's report, decide a stored run again under
another policy, list runs, write the long-context corpus, serve the service.

Exit codes of ``run`` (and ``report``, ``judge``): 0 pass, 1 fail, 2 could not decide (the
baseline side failed, too few prompts, an interrupted run, bad input or unusable outputs). The verdict and the
report's path go to stdout; progress, logs and errors to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kdtree_parity import long_corpus
from kdtree_parity.corpus import CorpusError, parse_corpus
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.policy import PolicyError, load_policy, policy_yaml
from kdtree_parity.progress_lines import ProgressLines
from kdtree_parity.rejudge import NotDecided, rejudge
from kdtree_parity.report import build_report, render_with_resolution
from kdtree_parity.report import write_report_files as write_reports
from kdtree_parity.report.resolution import ResolutionError, ResolutionTable, load_resolution
from kdtree_parity.report.schema import Report
from kdtree_parity.results import PromptResult
from kdtree_parity.runner import (
    IdentityChanged,
    ProgressCallback,
    RunRefused,
    Targets,
    execute_run,
    prepare_run,
    start_run,
)
from kdtree_parity.settings import ParitySettings, SettingsError, load_settings, target_tokens
from kdtree_parity.store import (
    VERDICT_TO_STATUS,
    AsyncStore,
    LeaseLost,
    RunRecord,
    RunStatus,
    Store,
    StoreError,
)
from kdtree_parity.untrusted_text import for_terminal, printable
from kdtree_parity.version import add_version_flag

EXIT: dict[RunStatus, ExitCode] = {
    "passed": ExitCode.PASSED,
    "failed": ExitCode.FAILED,
    "error": ExitCode.ERROR,
    "interrupted": ExitCode.ERROR,
    "running": ExitCode.ERROR,
}
console = Console(stderr=True, soft_wrap=True)  # progress, logs, errors
results = Console(soft_wrap=True)  # the verdict and where the report is: what a script reads
# Before a replay, --out must take a real write of PROBE_BYTES (flushed to the device) and then
# still have MIN_FREE_BYTES free: the reports of a 200-prompt run are a few MB.
PROBE_BYTES = 1 << 20
MIN_FREE_BYTES = 32 << 20
# What a new run is made of (flag -> setting); a resume takes all of it from the stored run.
NEW_RUN_FLAGS = {
    "baseline": "baseline_url",
    "candidate": "candidate_url",
    "replica": "replica_url",
    "floor": "floor_url",
    "corpus": "corpus",
    "policy": "policy",
    "out": "out",
}


def _add_db(p: argparse.ArgumentParser, settings: ParitySettings) -> None:
    p.add_argument("--db", default=settings.db, help="SQLite file (env KDTREE_PARITY_DB)")


def build_parser(settings: ParitySettings | None = None) -> argparse.ArgumentParser:
    """The CLI; its defaults come from ``settings`` (by default: the environment's)."""
    settings = load_settings() if settings is None else settings
    parser = argparse.ArgumentParser(
        prog="kdtree-parity",
        description="Replay a corpus against a baseline and a candidate inference server, compare "
        "greedy outputs token by token against A/A noise, and decide by a policy.",
    )
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    # The flags of NEW_RUN_FLAGS default to None here and to the settings in _run, so that a
    # --resume can tell a flag given beside it (refused) from the environment (ignored).
    run = sub.add_parser("run", help="run the gate (exit 0 pass, 1 fail, 2 could not decide)")
    run.add_argument("--baseline", help="baseline URL (env KDTREE_PARITY_BASELINE_URL)")
    run.add_argument("--candidate", help="candidate URL (env KDTREE_PARITY_CANDIDATE_URL)")
    run.add_argument(
        "--replica",
        help="a second baseline server for A/A noise; without one the baseline is replayed twice",
    )
    run.add_argument(
        "--floor",
        help="the A/A' target (env KDTREE_PARITY_FLOOR_URL): the baseline's model and weights "
        "computed an equivalent, not bit-identical way (e.g. another KV split count); the "
        "candidate is then judged by its excess over this noise floor",
    )
    for role in ("baseline", "candidate", "replica", "floor"):
        run.add_argument(
            f"--{role}-image",
            default=getattr(settings, f"{role}_image"),
            help=f"{role} image digest or reference, recorded in the report",
        )
    run.add_argument("--corpus", help="JSONL path or long|default|short (env KDTREE_PARITY_CORPUS)")
    run.add_argument("--policy", help="YAML path or default|short")
    run.add_argument("--out", help="reports go to OUT/RUN_ID/")
    run.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue an interrupted or errored run with its stored targets, corpus, policy and "
        "out dir (giving any of those too is refused); image labels are compared",
    )
    run.add_argument(
        "--accept-identity-change",
        action="store_true",
        help="resume even if a target is not the build the run started with (recorded in the "
        "run and shown in its report)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--resolution",
        default=None,
        help="resolution table (bench/kdtree_bench/e2e/parity_resolution.py's resolution.json) to "
        "print in the HTML and Markdown reports",
    )
    _add_db(run, settings)
    run.set_defaults(settings=settings)

    report = sub.add_parser("report", help="render a stored run's report")
    report.add_argument("run_id")
    report.add_argument(
        "--format",
        choices=("md", "json", "html", "files"),
        default="md",
        help="print md/json/html to stdout, or write all three files",
    )
    report.add_argument("--out", default=settings.out, help="where 'files' writes")
    report.add_argument(
        "--resolution", default=None, help="resolution table to print in the md/html report"
    )
    _add_db(report, settings)

    judge = sub.add_parser(
        "judge",
        help="decide a stored run again under another policy, replaying nothing (exit 0 pass, "
        "1 fail); the stored run and its verdict stay as they are",
    )
    judge.add_argument("run_id")
    judge.add_argument("--policy", required=True, help="YAML path or default|short")
    _add_db(judge, settings)

    lst = sub.add_parser("list", help="list stored runs, newest first")
    lst.add_argument("--limit", type=int, default=20)
    _add_db(lst, settings)

    corpus = sub.add_parser(
        "corpus",
        help="write the long-context corpus (retrieval prompts in context-length buckets, "
        "generated from a fixed seed) to a JSONL file",
    )
    corpus.add_argument("kind", choices=("long",), help="the corpus to generate")
    corpus.add_argument("--out", required=True, help="the JSONL file to write")
    corpus.add_argument(
        "--buckets",
        type=_token_counts,
        default=long_corpus.DEFAULT_BUCKETS,
        help="prompt lengths in tokens, comma-separated (default "
        f"{','.join(map(str, long_corpus.DEFAULT_BUCKETS))})",
    )
    corpus.add_argument(
        "--per-bucket", type=int, default=long_corpus.DEFAULT_PER_BUCKET, help="prompts per bucket"
    )
    corpus.add_argument("--seed", type=int, default=long_corpus.DEFAULT_SEED)
    corpus.add_argument(
        "--tokenizer",
        help="a model directory: write input_ids of exactly each bucket's length in this "
        "model's tokens (default: text, sized in bytes: exact for byte-level tokenizers)",
    )
    corpus.add_argument(
        "--base",
        default=long_corpus.DEFAULT_BASE,
        help="corpus whose prompts come first (a path or shipped name; 'none' for none)",
    )

    sub.add_parser("schema", help="print the JSON Schema of report.json")

    pol = sub.add_parser("policy", help="print a policy as the gate reads it")
    pol.add_argument(
        "--show",
        metavar="POLICY",
        required=True,
        help="YAML path or default|short: prints every key with its effective value as YAML",
    )

    serve = sub.add_parser(
        "serve", help="run the HTTP service (configuration from the environment)"
    )
    serve.add_argument("--host", default=settings.host)
    serve.add_argument("--port", type=int, default=settings.port)
    serve.set_defaults(settings=settings)
    return parser


def _token_counts(value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(
            f"expected positive token counts like 1024,8192: {value!r}"
        )
    return counts


def _print_reasons(verdict: Any, heading: str) -> None:
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


def _print_verdict(report: Report, paths: dict[str, Path] | None) -> None:
    _print_reasons(report.verdict, f"run {report.run.id}")
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


class _Refusal(Exception):
    """A reason to stop before anything is replayed: one line on stderr, exit 2."""


def _open_store(db: str, lease_s: float) -> Store:
    try:
        store = Store(db, lease_s=lease_s)
    except (OSError, sqlite3.Error, StoreError) as exc:
        raise _Refusal(f"cannot use the run database {db}: {exc}") from None
    try:
        store.check_writable()
    except sqlite3.Error as exc:
        store.close()
        raise _Refusal(f"cannot use the run database {db}: {exc}") from None
    return store


def _open_store_read_only(db: str) -> Store:
    """For list and report: nothing is created or written (a typo is not a new database)."""
    try:
        return Store(db, read_only=True)
    except (OSError, sqlite3.Error, StoreError) as exc:
        raise _Refusal(f"cannot read the run database {db}: {exc}") from None


def _check_out_dir(out: str) -> Path:
    """Reports must be writable before a whole corpus is replayed for them: a real write of
    PROBE_BYTES, flushed to the device, and MIN_FREE_BYTES left after it. Creating an empty file
    is not enough: it succeeds on a full disk."""
    path = Path(out).resolve()
    # The folders this check creates, deepest last: a refusal removes them again.
    created = [p for p in (path, *path.parents) if not p.exists()][::-1]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-") as probe:
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
        stat = os.statvfs(path)
        free = stat.f_bavail * stat.f_frsize
        if free < MIN_FREE_BYTES:
            raise _Refusal(
                f"cannot write reports to {path}: {free / 2**20:.1f} MiB free, the reports need "
                f"at least {MIN_FREE_BYTES >> 20} MiB"
            )
    except (OSError, _Refusal) as exc:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(exc, _Refusal):
            raise
        raise _Refusal(f"cannot write reports to {path}: {exc}") from None
    return path


def _refuse(action: Callable[[], int]) -> int:
    try:
        return action()
    except _Refusal as exc:
        console.print(f"[red]{for_terminal(exc, keep_newlines=True)}", highlight=False)
        return ExitCode.ERROR


def _cmd_run(args: argparse.Namespace) -> int:
    return _refuse(lambda: _run(args))


def _images(args: argparse.Namespace, has_replica: bool) -> dict[str, str | None]:
    """Image labels by role; the A/A twin is the replica, or the baseline replayed twice."""
    images = {"baseline": args.baseline_image, "candidate": args.candidate_image}
    if has_replica:
        images["aa"] = args.replica_image
    elif args.baseline_image:
        images["aa"] = args.baseline_image
    if args.floor_image:
        images["floor"] = args.floor_image
    return images


def _run(args: argparse.Namespace) -> int:
    if args.resume:
        given = [f"--{flag}" for flag in NEW_RUN_FLAGS if getattr(args, flag) is not None]
        if given:
            raise _Refusal(
                f"cannot resume {args.resume} with {', '.join(given)}: a resume replays the "
                "stored run's targets, corpus, policy and out dir; start a new run to change them"
            )
    else:
        for flag, setting in NEW_RUN_FLAGS.items():
            if getattr(args, flag) is None:
                setattr(args, flag, getattr(args.settings, setting))
    resolution = _resolution(args.resolution)
    try:
        tokens = target_tokens(args.settings)
    except SettingsError as exc:
        raise _Refusal(str(exc)) from None
    if not args.resume:
        if not args.baseline or not args.candidate:
            raise _Refusal("--baseline and --candidate are required")
        urls = {
            f"--{role}": getattr(args, role)
            for role in ("baseline", "candidate", "replica", "floor")
        }
        try:
            prepared = prepare_run(args.corpus, args.policy, urls)
        except RunRefused as exc:
            raise _Refusal(exc.problems[0]) from None  # one line: the first problem
        out_dir = _check_out_dir(args.out)
    store = _open_store(args.db, args.settings.lease_s)
    try:
        if args.resume:
            try:
                record = store.get_run(args.resume)
            except KeyError:
                raise _Refusal(f"cannot resume {args.resume}: no such run in {args.db}") from None
            if record.out_dir:
                _check_out_dir(record.out_dir)
            try:
                record = store.claim_for_resume(args.resume)
            except ValueError as exc:
                raise _Refusal(f"cannot resume {args.resume}: {exc}") from None
            images = _images(args, _has_replica(record))
            run_id, total = record.id, record.prompts_total
            console.print(f"resuming run {run_id}: {record.prompts_ok}/{total} prompts done")
        else:
            run_id = start_run(
                store,
                prepared.corpus,
                prepared.policy,
                Targets(
                    args.baseline,
                    args.candidate,
                    args.replica or None,
                    args.baseline_image or None,
                    args.candidate_image or None,
                    args.replica_image or None,
                    args.floor or None,
                    args.floor_image or None,
                ),
                out_dir=str(out_dir),
            )
            images = _images(args, bool(args.replica))
            total = len(prepared.corpus)
            console.print(
                f"run {run_id}: {total} prompts, corpus {for_terminal(prepared.corpus.source)}",
                highlight=False,
            )
        counts = {"hard": 0, "near_tie": 0, "errors": 0}
        with Progress(
            TextColumn("[bold]replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            disable=args.no_progress or not console.is_terminal,
        ) as bar:
            task = bar.add_task("", total=total)
            lines = None
            if not args.no_progress and not console.is_terminal:
                lines = ProgressLines(
                    lambda line: console.print(line, highlight=False),
                    args.settings.progress_every,
                    args.settings.progress_seconds,
                )

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
                if lines is not None:
                    lines.update(done, _total, counts)

            run = _run_with_signals(
                store,
                run_id,
                progress,
                images,
                args.accept_identity_change,
                resolution,
                tokens=tokens,
                ticker=lines,
            )
            try:
                asyncio.run(run)
            except KeyboardInterrupt:
                console.print("[yellow]interrupted: the run is recorded as interrupted (--resume)")
            except IdentityChanged as exc:
                raise _Refusal(f"resume refused: {exc}") from None
            except LeaseLost as exc:
                raise _Refusal(f"run {run_id} was taken over by another process: {exc}") from None
            except Exception as exc:  # recorded as an error run by execute_run; say why, exit 2
                console.print(
                    f"[red]run failed: {type(exc).__name__}: {for_terminal(exc, keep_newlines=True)}",
                    highlight=False,
                )
        record = store.get_run(run_id)
        paths = None
        if record.out_dir:
            paths = _report_paths(Path(record.out_dir) / run_id)
            if paths is None:  # e.g. the out dir became unwritable; the run says so (error)
                console.print(
                    f"[red]no reports in {for_terminal(record.out_dir)}: "
                    f"{for_terminal(record.error)}",
                    highlight=False,
                )
        _print_verdict(build_report(store, run_id), paths)
        return EXIT[record.status]
    finally:
        store.close()


def _has_replica(record: RunRecord) -> bool:
    return record.targets["aa"][0] != record.targets["baseline"][0]


def _report_paths(directory: Path) -> dict[str, Path] | None:
    paths = {key: directory / f"report.{key}" for key in ("json", "html", "md")}
    return paths if all(p.is_file() for p in paths.values()) else None


async def _run_with_signals(
    store: Store,
    run_id: str,
    progress: ProgressCallback,
    images: dict[str, str | None],
    accept_identity_change: bool,
    resolution: ResolutionTable | None = None,
    *,
    tokens: dict[str, str] | None = None,
    ticker: ProgressLines | None = None,
) -> None:
    """SIGTERM cancels the run like Ctrl-C, so it is recorded as interrupted, not left running.
    ``ticker``: progress lines between prompts, for logs without a terminal."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    async_store = AsyncStore(store)  # the run's own thread; the store stays the CLI's after it
    ticking = asyncio.create_task(ticker.run_ticker()) if ticker is not None else None
    try:
        await execute_run(
            async_store,
            run_id,
            progress=progress,
            images={role: label for role, label in images.items() if label},
            accept_identity_change=accept_identity_change,
            resolution=resolution,
            tokens=tokens,
            notice=lambda message: console.print(message, highlight=False),
        )
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        if ticking is not None:
            ticking.cancel()
        async_store.shutdown()


def _resolution(path: str | None) -> ResolutionTable | None:
    if not path:
        return None
    try:
        return load_resolution(path)
    except ResolutionError as exc:
        raise _Refusal(str(exc)) from None


def _cmd_report(args: argparse.Namespace) -> int:
    return _refuse(lambda: _report(args))


def _report(args: argparse.Namespace) -> int:
    resolution = _resolution(args.resolution)
    store = _open_store_read_only(args.db)
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
                raise _Refusal(f"cannot write reports to {args.out}: {exc}") from None
            _print_verdict(report, paths)
        else:
            sys.stdout.write(render_with_resolution(report, args.format, resolution))
        return EXIT[report.run.status]
    finally:
        store.close()


def _cmd_judge(args: argparse.Namespace) -> int:
    return _refuse(lambda: _judge(args))


def _judge(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        raise _Refusal(str(exc)) from None
    store = _open_store_read_only(args.db)
    try:
        try:
            done = rejudge(store, args.run_id, policy)
        except KeyError:
            raise _Refusal(f"no run {args.run_id} in {args.db}") from None
        except NotDecided as exc:
            raise _Refusal(str(exc)) from None
    finally:
        store.close()
    for difference in done.replay_differences:
        console.print(
            f"[yellow]not applied (the answers are stored): {for_terminal(difference)}",
            highlight=False,
        )
    _print_reasons(
        done.verdict,
        f"run {done.record.id} under {policy.source}; stored verdict under "
        f"{done.record.policy_source}: {done.record.status}",
    )
    return EXIT[VERDICT_TO_STATUS[done.verdict.status]]


def _cmd_list(args: argparse.Namespace) -> int:
    return _refuse(lambda: _list(args))


def _list(args: argparse.Namespace) -> int:
    """A table on a terminal; tab-separated lines (one run each) when piped, for scripts."""
    store = _open_store_read_only(args.db)
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
                table.add_row(*map(for_terminal, row))
            Console().print(table)
        else:
            for row in [columns, *rows]:
                print("\t".join(printable(cell) for cell in row))
        return ExitCode.PASSED
    finally:
        store.close()


def _cmd_corpus(args: argparse.Namespace) -> int:
    """Write the generated corpus; stdout names the file, its prompts and its sha256."""
    try:
        encode = long_corpus.tokenizer_encoder(args.tokenizer) if args.tokenizer else None
        data = long_corpus.long_corpus_jsonl(
            args.buckets,
            args.per_bucket,
            args.seed,
            encode,
            base=None if args.base == "none" else args.base,
        )
        corpus = parse_corpus(data, source=args.out)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    except (CorpusError, ValueError, RuntimeError, OSError) as exc:
        console.print(f"[red]kdtree-parity corpus: {exc}", highlight=False)
        return ExitCode.ERROR
    longest = max(e.max_prompt_tokens for e in corpus.entries)
    results.print(
        f"{out}: {len(corpus)} prompts, the longest {longest} tokens at most, "
        f"sha256 {corpus.sha256}",
        highlight=False,
    )
    return ExitCode.PASSED


def _cmd_schema(_: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(Report.model_json_schema(), indent=1) + "\n")
    return ExitCode.PASSED


def _cmd_policy(args: argparse.Namespace) -> int:
    try:
        loaded = load_policy(args.show)
    except PolicyError as exc:
        console.print(f"[red]{for_terminal(exc, keep_newlines=True)}", highlight=False)
        return ExitCode.ERROR
    sys.stdout.write(f"# effective policy of {loaded.source} (sha256 {loaded.sha256})\n")
    sys.stdout.write(policy_yaml(loaded.policy))
    return ExitCode.PASSED


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn  # the service's imports are only paid for by `serve`

    from kdtree_parity.logs import log_config
    from kdtree_parity.service import ConfigurationError, ServiceSettings, create_app

    try:
        app = create_app(ServiceSettings.from_settings(args.settings))
    except ConfigurationError as exc:
        console.print(
            f"[red]kdtree-parity serve: {for_terminal(exc, keep_newlines=True)}", highlight=False
        )
        return ExitCode.ERROR
    # Idle connections are kept well past clients' pool expiry (httpx: 5 s, uvicorn's default
    # too), so a client never reuses a connection the service is closing at that moment.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_config=log_config(),  # JSON lines, run events included (kdtree_parity.logs)
        log_level="info",
        timeout_keep_alive=75,
    )
    return ExitCode.PASSED


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        console.print(
            f"[red]kdtree-parity: {for_terminal(exc, keep_newlines=True)}", highlight=False
        )
        return ExitCode.ERROR
    args = build_parser(settings).parse_args(argv)
    handler = {
        "run": _cmd_run,
        "report": _cmd_report,
        "judge": _cmd_judge,
        "list": _cmd_list,
        "corpus": _cmd_corpus,
        "schema": _cmd_schema,
        "policy": _cmd_policy,
        "serve": _cmd_serve,
    }[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
