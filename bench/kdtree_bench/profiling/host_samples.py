"""Where an SGLang scheduler's host time goes: py-spy samples of each server, and their summary.

A decode step on a small model or a short prefix can be bound by SGLang's Python loop rather
than by the GPU. Which one binds shows in the scheduler's stacks: a GPU-bound scheduler spends
its time waiting in ``copy_done.synchronize()`` while it processes the previous step's result;
a host-bound one hardly waits there at all, and its step is its own loop's length.

``HostSampler`` runs py-spy (``record --nonblocking --format raw``: the process is never
stopped) on every ``sglang::scheduler`` process of each server while a measurement runs
(``bench/kdtree_bench/e2e/sglang_e2e.py --host-samples``); py-spy must be on PATH (on the GPU machine its wheel
travels in ``.sglsite/wheels``, docs/development.md). py-spy leaves out samples of an idle thread
(one blocked in a system call), so ``busy`` counts the scheduler's active time, 1/rate s each.

``summarize`` sorts each file's samples (collapsed stacks, one ``frame;frame;... count`` line
each) into the categories of ``CATEGORIES``, by the first that matches:

- ``waiting_for_gpu``: SGLang's decode result processing blocked in a ``synchronize``;
- ``plugin``: kdtree's own code: a ``kdtree_inference`` frame below which only kdtree's and the
  libraries' it calls (``OWN_CALLEES``) run, not SGLang's (the backend's overrides call the
  parent's methods, which are SGLang's time);
- ``forward``: the rest of ``run_batch`` (the forward's Python: draft, verify, draft extend);
- ``results``: the rest of ``process_batch_result``;
- ``idle_loop``: ``on_idle`` (the scheduler between requests) and ``ingest_requests``;
- ``other``.

Usage:
    python -m kdtree_bench.profiling.host_samples NAME=PYSPY_RAW_FILE ... [--out summary.md]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kdtree_bench.cli import emit_table, name_and_path

SCHEDULER_TITLE = "sglang::scheduler"
"""The process title SGLang gives its scheduler processes (``setproctitle``)."""
CATEGORIES = ("waiting_for_gpu", "plugin", "forward", "results", "idle_loop", "other")
OWN_CALLEES = ("kdtree_", "prometheus_client", "torch/")
"""Path parts of the frames kdtree's code calls into. py-spy shortens a path to its shortest
unique suffix unless ``--full-filenames`` (which ``HostSampler`` passes) is given, so in older
recordings a library frame named by its file alone counts as SGLang's."""


def _function(frame: str) -> str:
    """``name (path:line)`` -> ``name``."""
    return frame.split(" (", 1)[0]


def _path(frame: str) -> str:
    return frame.rsplit("(", 1)[-1] if "(" in frame else ""


def category(frames: list[str]) -> str:
    """The category of one stack (outermost frame first)."""
    names = [_function(f) for f in frames]
    if "process_batch_result_decode" in names and any("synchronize" in n for n in names):
        return "waiting_for_gpu"
    ours = [i for i, f in enumerate(frames) if "kdtree_inference" in _path(f)]
    if ours and all(any(part in _path(f) for part in OWN_CALLEES) for f in frames[ours[-1] + 1 :]):
        return "plugin"
    if "run_batch" in names:
        return "forward"
    if "process_batch_result" in names:
        return "results"
    if "on_idle" in names or "ingest_requests" in names:
        return "idle_loop"
    return "other"


def parse_raw(lines: Iterable[str]) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw (collapsed) format -> (frames, samples); malformed lines are skipped."""
    for line in lines:
        stack, sep, count = line.rstrip("\n").rpartition(" ")
        if not sep or not count.isdigit():
            continue
        yield (stack.split(";") if stack else []), int(count)


def summarize(path: Path) -> dict[str, int]:
    """Samples per category of one py-spy raw file, and ``busy`` (their total)."""
    counts: Counter[str] = Counter({name: 0 for name in CATEGORIES})
    with path.open(errors="replace") as lines:
        for frames, samples in parse_raw(lines):
            counts[category(frames)] += samples
    return {"busy": sum(counts.values()), **{name: counts[name] for name in CATEGORIES}}


def summary_markdown(summaries: dict[str, dict[str, int]]) -> str:
    names = list(summaries)
    lines = [
        "| samples (py-spy, busy only) | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for key in ("busy", *CATEGORIES):
        cells = []
        for name in names:
            value, busy = summaries[name][key], summaries[name]["busy"]
            share = "" if key == "busy" or not busy else f" ({100 * value / busy:.1f}%)"
            cells.append(f"{value:,}{share}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def scheduler_pids(session: int, proc: Path = Path("/proc")) -> list[int]:
    """The ``sglang::scheduler`` processes of one server: SGLang's children share the session
    its launcher started (``SGLangServer`` starts each in a new session)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # stat: "pid (comm) state ppid pgrp session ..."; comm may hold spaces.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if int(fields[3]) == session and title.startswith(SCHEDULER_TITLE):
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class _Recording:
    name: str
    output: Path
    process: subprocess.Popen


class HostSampler:
    """py-spy on each server's schedulers for the duration of a ``with`` block.

    ``servers``: name -> launcher pid (the session id of the server's processes). Writes
    ``folder/pyspy_NAME.txt`` (raw samples; ``NAME_PID`` when a server has several schedulers)
    and, on exit, ``folder/host_samples.md`` (``summarize`` side by side)."""

    def __init__(self, servers: dict[str, int], folder: Path, rate: int = 100) -> None:
        self.py_spy = shutil.which("py-spy")
        if self.py_spy is None:
            raise RuntimeError("py-spy is not on PATH (pip install py-spy; docs/development.md)")
        self.servers, self.folder, self.rate = servers, folder, rate
        self.recordings: list[_Recording] = []

    def __enter__(self) -> HostSampler:
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, session in self.servers.items():
            pids = scheduler_pids(session)
            if not pids:
                raise RuntimeError(f"{name}: no {SCHEDULER_TITLE} process in session {session}")
            for pid in pids:
                label = name if len(pids) == 1 else f"{name}_{pid}"
                output = self.folder / f"pyspy_{label}.txt"
                log = (self.folder / f"pyspy_{label}.log").open("wb")
                command = [self.py_spy, "record", "--nonblocking", "--full-filenames"]
                command += ["--format", "raw"]
                command += ["--rate", str(self.rate), "--pid", str(pid), "--output", str(output)]
                with log:
                    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                self.recordings.append(_Recording(label, output, process))
        return self

    def __exit__(self, *exc_info: object) -> None:
        # py-spy writes its samples when interrupted, as after Ctrl-C.
        for recording in self.recordings:
            with contextlib.suppress(ProcessLookupError):
                recording.process.send_signal(signal.SIGINT)
        for recording in self.recordings:
            try:
                recording.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                recording.process.kill()
                recording.process.wait()
        summaries = {r.name: summarize(r.output) for r in self.recordings if r.output.is_file()}
        if summaries:
            (self.folder / "host_samples.md").write_text(summary_markdown(summaries))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "files",
        nargs="+",
        type=name_and_path("NAME=PYSPY_RAW_FILE"),
        help="NAME=PYSPY_RAW_FILE (py-spy --format raw)",
    )
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    summaries = {}
    for name, path in args.files:
        if not path.is_file():
            print(f"host_samples: no file {path}", file=sys.stderr)
            return 2
        summaries[name] = summarize(path)
    emit_table(summary_markdown(summaries), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
