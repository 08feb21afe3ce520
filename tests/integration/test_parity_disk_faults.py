"""The sidecar on disks that say no, for real: a full filesystem (a small tmpfs, filled) and a
read-only one (a read-only bind mount), each in a private mount namespace (root: CI runs the
tests as root; a plain ``make test`` as another user skips them, CI=true fails instead).

A full --out is refused before anything is replayed; reports that fail to write leave no
temporary files behind; list and report read a database in a read-only directory.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from parity_support import write_inputs

from kdtree_parity.compare import compare_generations
from kdtree_parity.corpus import parse_corpus
from kdtree_parity.gate import decide, summarize
from kdtree_parity.generation import Generation, TopLogprob
from kdtree_parity.policy import parse_policy
from kdtree_parity.results import Outcome, PromptResult
from kdtree_parity.runner import start_run, verdict_to_json
from kdtree_parity.store import Store
from kdtree_parity.targets import Targets

pytestmark = pytest.mark.slow
PY = shlex.quote(sys.executable)


def passed_run(db: Path) -> str:
    """A finished one-prompt run (all three answers identical) in a new database at ``db``."""
    store = Store(db)
    corpus = parse_corpus(b'{"id": "a", "text": "x"}\n', source="c.jsonl")
    policy = parse_policy("gate: {min_prompts: 1}\n")
    run_id = start_run(
        store, corpus, policy, Targets.from_urls("http://127.0.0.1:9", "http://127.0.0.1:10")
    )
    g = Generation(
        output_ids=(1, 2),
        token_logprobs=(-0.1, -0.1),
        top_logprobs=((TopLogprob(1, -0.1),), (TopLogprob(2, -0.1),)),
        token_texts=("a", "b"),
        finish_reason="length",
        text="ab",
    )
    answer = Outcome(g, None, 1, 0.01)
    same = compare_generations(g, g, 0.05)
    result = PromptResult(
        entry=corpus.entries[0],
        candidate=same,
        aa=same,
        outcomes={"baseline": answer, "candidate": answer, "aa": answer},
    )
    store.save_result(run_id, 0, result)
    verdict = decide(summarize(store.results(run_id), 1), policy.policy.gate)
    store.finish_run(run_id, "passed", verdict=verdict_to_json(verdict))
    store.close()
    return run_id


def in_private_mounts(script: str) -> subprocess.CompletedProcess:
    """``script`` (sh) in its own mount namespace, so its mounts vanish with it."""
    if os.getuid() != 0 or shutil.which("unshare") is None:
        reason = "mounting a small or read-only filesystem needs root and unshare"
        if os.environ.get("CI"):
            pytest.fail(reason + ", and CI must run this", pytrace=False)
        pytest.skip(reason)
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )


def full_tmpfs(path: Path) -> str:
    """sh: mount a 256 KiB tmpfs at ``path`` and fill it to the last block."""
    q = shlex.quote(str(path))
    return (
        f"mkdir -p {q} && mount -t tmpfs -o size=256k tmpfs {q} "
        f"&& {{ head -c 1M /dev/zero > {q}/fill 2>/dev/null; true; }}"
    )


def test_a_full_out_dir_is_refused_before_the_replay(tmp_path: Path) -> None:
    corpus, policy = write_inputs(tmp_path, 3, health_deadline_s=1)
    out, db = tmp_path / "full", tmp_path / "runs.sqlite3"
    cli = (
        f"{PY} -m kdtree_parity.cli run --baseline http://127.0.0.1:9 --candidate "
        f"http://127.0.0.1:10 --corpus {corpus} --policy {policy} --out {out}/reports "
        f"--db {db} --no-progress"
    )
    done = in_private_mounts(full_tmpfs(out) + f" && {cli}; echo left: $(ls -A {out})")
    assert done.returncode == 0, done.stderr  # the echo's status; the CLI's is in stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"cannot write reports to {out}/reports: ")
    assert "No space left on device" in line or "MiB free" in line
    # No probe file and no folder of the check's own left behind.
    assert done.stdout.split() == ["left:", "fill"]
    assert not db.exists()  # refused before a run (or even the database) was made


def test_reports_that_do_not_fit_leave_no_temporary_files(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite3"
    run_id = passed_run(db)
    out = tmp_path / "full"
    write = (
        "import sys; from pathlib import Path; from kdtree_parity.store import Store; "
        "from kdtree_parity.report import write_report_files\n"
        "try:\n"
        f"    write_report_files(Store({str(db)!r}), {run_id!r}, Path({str(out)!r}))\n"
        "except OSError as exc:\n"
        "    print('refused:', exc.strerror)\n"
    )
    listing = f"find {shlex.quote(str(out))} -name '*.tmp'"
    done = in_private_mounts(full_tmpfs(out) + f" && {PY} -c {shlex.quote(write)} && {listing}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused: No space left on device"], done.stdout


def test_list_and_report_read_a_database_in_a_read_only_directory(tmp_path: Path) -> None:
    home = tmp_path / "ro"
    home.mkdir()
    db = home / "runs.sqlite3"
    run_id = passed_run(db)
    q = shlex.quote(str(home))
    script = (
        f"mount --bind {q} {q} && mount -o remount,bind,ro {q} "
        f"&& {PY} -m kdtree_parity.cli list --db {db} "
        f"&& {PY} -m kdtree_parity.cli report {run_id} --format json --db {db} > {tmp_path}/r.json"
        f"; echo exit=$? && ls -A {q}"
    )
    done = in_private_mounts(script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split("\t")[:2] == ["run", "status"]
    row = lines[1].split("\t")
    assert (row[0], row[1], row[3]) == (run_id, "passed", "1/1")
    assert "exit=0" in lines and lines[-1] == "runs.sqlite3", done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["id"] == run_id and report["verdict"]["status"] == "pass"
