"""What a run's report says when the run itself ended badly: the first line of a stored error,
never its traceback, and a run with no recorded end named as such."""

from __future__ import annotations

from pathlib import Path

from parity_factories import run_parity_cli

from kdtree_parity.corpus import parse_corpus
from kdtree_parity.policy import parse_policy
from kdtree_parity.runner import start_run
from kdtree_parity.store import Store
from kdtree_parity.targets import Targets

POLICY = "gate:\n  min_prompts: 1\n"


def test_a_stored_traceback_stays_out_of_the_verdict(tmp_path: Path) -> None:
    """Before: a run ended by an exception (the database locked past its busy timeout) showed
    the whole traceback as the verdict's ``complete`` reason."""
    db = tmp_path / "runs.sqlite3"
    store = Store(db)
    corpus = parse_corpus(b'{"id": "x", "text": "x"}\n', source="c.jsonl")
    policy = parse_policy(POLICY, source="p.yaml")
    run_id = start_run(
        store, corpus, policy, Targets.from_urls("http://127.0.0.1:1", "http://127.0.0.1:2")
    )
    error = (
        "OperationalError: database is locked\nTraceback (most recent call last):\n"
        '  File "runner.py", line 1, in execute_run\nsqlite3.OperationalError: database is locked'
    )
    store.finish_run(run_id, "error", error=error)
    store.close()
    done = run_parity_cli("report", run_id, "--format", "md", "--db", db)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stdout
    assert "run stopped: error: OperationalError: database is locked" in done.stdout


def test_a_run_that_recorded_no_end_says_so(tmp_path: Path) -> None:
    """Before: a run whose process could not record its end (a full disk) read "the run is
    running"."""
    db = tmp_path / "runs.sqlite3"
    store = Store(db)
    corpus = parse_corpus(b'{"id": "x", "text": "x"}\n', source="c.jsonl")
    policy = parse_policy(POLICY, source="p.yaml")
    run_id = start_run(
        store, corpus, policy, Targets.from_urls("http://127.0.0.1:1", "http://127.0.0.1:2")
    )
    store.close()
    done = run_parity_cli("report", run_id, "--format", "md", "--db", db)
    assert "no end recorded" in done.stdout and "the run is running" not in done.stdout
