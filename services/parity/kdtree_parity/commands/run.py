"""``kdtree-parity run``: run the gate (exit 0 pass, 1 fail, 2 could not decide), or resume a run
(``--resume RUN_ID``) with its stored targets, corpus, policy and out dir."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kdtree_parity.commands.options import (
    EXIT,
    Refusal,
    add_db,
    add_resolution,
    console,
    open_store,
    print_verdict,
    refusing,
    resolution_table,
)
from kdtree_parity.progress_lines import ProgressLines
from kdtree_parity.report import build_report
from kdtree_parity.report.resolution import ResolutionTable
from kdtree_parity.results import PromptResult
from kdtree_parity.runner import (
    IdentityChanged,
    PreparedRun,
    ProgressCallback,
    RunRefused,
    execute_run,
    prepare_run,
    start_run,
)
from kdtree_parity.settings import ParitySettings, SettingsError, target_tokens
from kdtree_parity.store import AsyncStore, LeaseLost, Store
from kdtree_parity.targets import TARGET_ROLES, Targets
from kdtree_parity.untrusted_text import for_terminal

HELP = "run the gate (exit 0 pass, 1 fail, 2 could not decide)"
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


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    # The flags of NEW_RUN_FLAGS default to None here and to the settings in `run`, so that a
    # --resume can tell a flag given beside it (refused) from the environment (ignored).
    parser.add_argument("--baseline", help="baseline URL (env KDTREE_PARITY_BASELINE_URL)")
    parser.add_argument("--candidate", help="candidate URL (env KDTREE_PARITY_CANDIDATE_URL)")
    parser.add_argument(
        "--replica",
        help="a second baseline server for A/A noise; without one the baseline is replayed twice",
    )
    parser.add_argument(
        "--floor",
        help="the A/A' target (env KDTREE_PARITY_FLOOR_URL): the baseline's model and weights "
        "computed an equivalent, not bit-identical way (e.g. another KV split count); the "
        "candidate is then judged by its excess over this noise floor",
    )
    for role in TARGET_ROLES:
        parser.add_argument(
            f"--{role}-image",
            default=getattr(settings, f"{role}_image"),
            help=f"{role} image digest or reference, recorded in the report",
        )
    parser.add_argument(
        "--corpus", help="JSONL path or long|default|short (env KDTREE_PARITY_CORPUS)"
    )
    parser.add_argument("--policy", help="YAML path or default|short")
    parser.add_argument("--out", help="reports go to OUT/RUN_ID/")
    parser.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue an interrupted or errored run with its stored targets, corpus, policy and "
        "out dir (giving any of those too is refused); image labels are compared",
    )
    parser.add_argument(
        "--accept-identity-change",
        action="store_true",
        help="resume even if a target is not the build the run started with (recorded in the "
        "run and shown in its report)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_resolution(
        parser,
        "resolution table (kdtree_bench.e2e.parity_resolution's resolution.json) to "
        "print in the HTML and Markdown reports",
    )
    add_db(parser, settings)
    parser.set_defaults(settings=settings)


@dataclass(frozen=True)
class Started:
    """A run claimed by this process, ready to replay."""

    run_id: str
    total: int
    images: dict[str, str]  # image labels given for this replay, by record key


@dataclass(frozen=True)
class NewRun:
    """A new run checked before anything is recorded: its targets, corpus, policy, out dir."""

    targets: Targets
    prepared: PreparedRun
    out_dir: Path


@refusing
def run(args: argparse.Namespace) -> int:
    settle_new_run_flags(args)
    resolution = resolution_table(args.resolution)
    try:
        tokens = target_tokens(args.settings)
    except SettingsError as exc:
        raise Refusal(str(exc)) from None
    new = None if args.resume else new_run(args)
    store = open_store(args.db, args.settings.lease_s)
    try:
        started = resume(store, args) if new is None else start(store, new)
        replay(store, started, args, resolution, tokens)
        return conclude(store, started.run_id)
    finally:
        store.close()


def settle_new_run_flags(args: argparse.Namespace) -> None:
    """A resume refuses the flags of a new run; a new run takes the settings for those not
    given."""
    if args.resume:
        given = [f"--{flag}" for flag in NEW_RUN_FLAGS if getattr(args, flag) is not None]
        if given:
            raise Refusal(
                f"cannot resume {args.resume} with {', '.join(given)}: a resume replays the "
                "stored run's targets, corpus, policy and out dir; start a new run to change them"
            )
        return
    for flag, setting in NEW_RUN_FLAGS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(args.settings, setting))


def new_run(args: argparse.Namespace) -> NewRun:
    """The new run the flags describe, checked: refused before anything is recorded."""
    targets = given_targets(args)
    prepared = prepare(args, targets)
    return NewRun(targets, prepared, check_out_dir(args.out))


def given_images(args: argparse.Namespace) -> dict[str, str | None]:
    """The ``--<role>-image`` labels, by role."""
    return {role: getattr(args, f"{role}_image") for role in TARGET_ROLES}


def given_targets(args: argparse.Namespace) -> Targets:
    """A new run's targets, from the flags (and the settings for those not given)."""
    if not args.baseline or not args.candidate:
        raise Refusal("--baseline and --candidate are required")
    return Targets.from_urls(
        args.baseline, args.candidate, args.replica, args.floor, images=given_images(args)
    )


def prepare(args: argparse.Namespace, targets: Targets) -> PreparedRun:
    """The corpus and policy checked against each other and the targets (the first problem is
    the refusal: one line)."""
    try:
        return prepare_run(args.corpus, args.policy, targets.labelled_urls("--"))
    except RunRefused as exc:
        raise Refusal(exc.problems[0]) from None


def check_out_dir(out: str) -> Path:
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
            raise Refusal(
                f"cannot write reports to {path}: {free / 2**20:.1f} MiB free, the reports need "
                f"at least {MIN_FREE_BYTES >> 20} MiB"
            )
    except (OSError, Refusal) as exc:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(exc, Refusal):
            raise
        raise Refusal(f"cannot write reports to {path}: {exc}") from None
    return path


def start(store: Store, new: NewRun) -> Started:
    """Record a new run."""
    prepared, targets = new.prepared, new.targets
    run_id = start_run(store, prepared.corpus, prepared.policy, targets, out_dir=str(new.out_dir))
    total = len(prepared.corpus)
    console.print(
        f"run {run_id}: {total} prompts, corpus {for_terminal(prepared.corpus.source)}",
        highlight=False,
    )
    return Started(run_id, total, targets.record_images())


def resume(store: Store, args: argparse.Namespace) -> Started:
    """Claim the stored run ``--resume`` names; its reports' folder must still be writable."""
    try:
        record = store.get_run(args.resume)
    except KeyError:
        raise Refusal(f"cannot resume {args.resume}: no such run in {args.db}") from None
    if record.out_dir:
        check_out_dir(record.out_dir)
    try:
        record = store.claim_for_resume(args.resume)
    except ValueError as exc:
        raise Refusal(f"cannot resume {args.resume}: {exc}") from None
    targets = record.as_targets().with_images(given_images(args))
    console.print(
        f"resuming run {record.id}: {record.prompts_ok}/{record.prompts_total} prompts done"
    )
    return Started(record.id, record.prompts_total, targets.record_images())


def replay(
    store: Store,
    started: Started,
    args: argparse.Namespace,
    resolution: ResolutionTable | None,
    tokens: Mapping[str, str],
) -> None:
    """Execute the run with a progress bar (or progress lines without a terminal); how it ended
    is in the store, and an ending that is no verdict is said on stderr."""
    with progress_display(args, started.total) as (progress, lines):
        execution = run_with_signals(
            store,
            started.run_id,
            progress,
            started.images,
            args.accept_identity_change,
            resolution,
            tokens=tokens,
            ticker=lines,
        )
        try:
            asyncio.run(execution)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: the run is recorded as interrupted (--resume)")
        except IdentityChanged as exc:
            raise Refusal(f"resume refused: {exc}") from None
        except LeaseLost as exc:
            raise Refusal(
                f"run {started.run_id} was taken over by another process: {exc}"
            ) from None
        except Exception as exc:  # recorded as an error run by execute_run; say why, exit 2
            console.print(
                f"[red]run failed: {type(exc).__name__}: {for_terminal(exc, keep_newlines=True)}",
                highlight=False,
            )


@contextlib.contextmanager
def progress_display(
    args: argparse.Namespace, total: int
) -> Iterator[tuple[ProgressCallback, ProgressLines | None]]:
    """The replay's progress callback (a bar on a terminal, counting hard divergences, near-ties
    and errors) and, without a terminal, the progress lines it also feeds."""
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

        yield progress, lines


def conclude(store: Store, run_id: str) -> int:
    """Print the run's verdict and where its reports are; its status is the exit status."""
    record = store.get_run(run_id)
    paths = None
    if record.out_dir:
        paths = report_paths(Path(record.out_dir) / run_id)
        if paths is None:  # e.g. the out dir became unwritable; the run says so (error)
            console.print(
                f"[red]no reports in {for_terminal(record.out_dir)}: {for_terminal(record.error)}",
                highlight=False,
            )
    print_verdict(build_report(store, run_id), paths)
    return EXIT[record.status]


def report_paths(directory: Path) -> dict[str, Path] | None:
    paths = {key: directory / f"report.{key}" for key in ("json", "html", "md")}
    return paths if all(p.is_file() for p in paths.values()) else None


async def run_with_signals(
    store: Store,
    run_id: str,
    progress: ProgressCallback,
    images: dict[str, str],
    accept_identity_change: bool,
    resolution: ResolutionTable | None = None,
    *,
    tokens: Mapping[str, str] | None = None,
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
            images=images,
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
