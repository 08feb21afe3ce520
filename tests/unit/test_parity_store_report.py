"""SQLite persistence (results, resume, crashed owners) and the JSON/HTML/Markdown reports."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from parity_factories import exact, failed, generation, hard, near_tie, ok, result

from kdtree_parity.corpus import CorpusEntry, parse_corpus
from kdtree_parity.gate import decide, summarize
from kdtree_parity.policy import parse_policy
from kdtree_parity.report import (
    build_report,
    render_html,
    render_markdown,
    report_json,
    write_report_files,
)
from kdtree_parity.report.schema import Report
from kdtree_parity.runner import execute_run, start_run, verdict_to_json
from kdtree_parity.store import AsyncStore, LeaseLost, PairBusy, Store, StoreError
from kdtree_parity.targets import Targets

POLICY_TEXT = "gate:\n  min_prompts: 2\n  min_exact_match_rate: 0.5\n"


def corpus_bytes(ids: list[str]) -> bytes:
    return "".join(json.dumps({"id": i, "text": f"prompt {i}"}) + "\n" for i in ids).encode()


def new_run(store: Store, ids: list[str], baseline: str = "http://127.0.0.1:1") -> str:
    corpus = parse_corpus(corpus_bytes(ids), source="unit.jsonl")
    policy = parse_policy(POLICY_TEXT, source="unit.yaml")
    return start_run(store, corpus, policy, Targets.from_urls(baseline, "http://127.0.0.1:2"))


def finish(store: Store, run_id: str, total: int) -> str:
    gate = parse_policy(POLICY_TEXT).policy.gate
    verdict = decide(summarize(store.results(run_id), total), gate)
    status = {"pass": "passed", "fail": "failed", "error": "error"}[verdict.status]
    store.finish_run(run_id, status, verdict=verdict_to_json(verdict))
    return status


def test_results_persist_and_reload_identically(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite3"
    store = Store(db)
    run_id = new_run(store, ["a", "b", "c"])
    saved = [exact("a"), hard("b"), near_tie("c")]
    for i, r in enumerate(saved):
        store.save_result(run_id, i, r)
    store.close()
    again = Store(db)
    assert again.results(run_id) == saved
    record = again.get_run(run_id)
    assert record.status == "running" and record.prompts_ok == 3 and record.prompts_total == 3
    assert record.targets["aa"][0] == record.targets["baseline"][0] == "http://127.0.0.1:1"
    assert finish(again, run_id, 3) == "failed"
    assert again.get_run(run_id).verdict["status"] == "fail"


def test_resume_replays_only_missing_and_errored_prompts(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.sqlite3")
    run_id = new_run(store, ["a", "b", "c"])
    store.save_result(run_id, 0, exact("a"))
    g = ok(generation([1]))
    store.save_result(run_id, 1, result("b", failed("connect"), g))
    store.finish_run(run_id, "interrupted", error="Ctrl-C")
    assert store.completed_prompt_ids(run_id) == {"a"}
    record = store.claim_for_resume(run_id)
    assert record.status == "running" and record.error is None
    with pytest.raises(ValueError, match="still running"):
        store.claim_for_resume(run_id)
    store.save_result(run_id, 1, exact("b"))  # the errored result is replaced
    store.save_result(run_id, 2, exact("c"))
    assert [r.entry.id for r in store.results(run_id)] == ["a", "b", "c"]
    assert not any(r.has_error for r in store.results(run_id))
    assert finish(store, run_id, 3) == "passed"
    with pytest.raises(ValueError, match="already finished as passed"):
        store.claim_for_resume(run_id)
    with pytest.raises(KeyError):
        store.claim_for_resume("no-such-run")


def test_a_run_whose_process_died_reads_as_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite3"
    code = (
        "import sys, json\n"
        "from kdtree_parity.store import Store\n"
        "s = Store(sys.argv[1])\n"
        "rid = s.create_run(pair='p', targets={'baseline': 'u', 'candidate': 'v', 'aa': 'u'},"
        " prompts_total=3, corpus_source='c', corpus_sha256='x', corpus_jsonl=b'', "
        "policy_source='p', policy_sha256='y', policy_text='', out_dir=None)\n"
        "print(rid)\n"
        "import os; os._exit(9)  # die without finishing, like a crash or SIGKILL\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    run_id = done.stdout.strip()
    store = Store(db)
    record = store.get_run(run_id)
    assert record.status == "interrupted"
    assert "exited before the run finished" in record.error
    report = build_report(store, run_id)
    assert report.verdict.status == "error"
    assert report.run.status == "interrupted"


def test_unreachable_targets_end_in_error_with_a_report(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = Store(tmp_path / "runs.sqlite3")
    corpus = parse_corpus(corpus_bytes(["a", "b"]), source="unit.jsonl")
    policy = parse_policy("replay:\n  health_deadline_s: 0.3\n" + POLICY_TEXT)
    run_id = start_run(
        store,
        corpus,
        policy,
        Targets.from_urls(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}"),
        out_dir=str(tmp_path / "out"),
    )
    outcome = asyncio.run(execute_run(AsyncStore(store), run_id))
    assert outcome.status == "error" and outcome.verdict.status == "error"
    assert "not healthy after 0.3s" in outcome.error
    record = store.get_run(run_id)
    assert record.status == "error"
    data = json.loads((tmp_path / "out" / run_id / "report.json").read_text())
    assert data["verdict"]["status"] == "error"


def test_report_json_html_and_markdown(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.sqlite3")
    run_id = new_run(store, ["same", "tie", "broken", "lost"])
    g = ok(generation([1, 2]))
    for i, r in enumerate(
        [exact("same"), near_tie("tie"), hard("broken"), result("lost", g, failed("http", 500))]
    ):
        store.save_result(run_id, i, r)
    assert finish(store, run_id, 4) == "failed"
    report = build_report(store, run_id)
    # JSON: strict (no NaN), and it validates against the published schema.
    text = report_json(report)
    assert Report.model_validate_json(text) == report
    data = json.loads(text)
    assert data["schema_version"] == 1 and data["verdict"]["status"] == "fail"
    statuses = {p["id"]: p["status"] for p in data["prompts"]}
    assert statuses == {"same": "exact", "tie": "near_tie", "broken": "hard", "lost": "error"}
    broken = next(p for p in data["prompts"] if p["id"] == "broken")
    assert broken["candidate"]["first_divergence"] == 2
    sides = {s["role"]: s for s in broken["sides"]}
    assert [t["token_id"] for t in sides["baseline"]["top_at_divergence"]] == [3, 4]
    assert data["summary"]["errors"]["candidate"] == {"http": 1}
    assert data["corpus"]["sha256"] == store.get_run(run_id).corpus_sha256
    # HTML: self-contained, verdict first, the hard prompt listed before the exact one.
    html = render_html(report)
    assert "Parity verdict: FAIL" in html
    assert "<script" not in html and "http://" not in html.split("<h2>Targets</h2>")[0]
    assert html.index('id="prompt-broken"') < html.index('id="prompt-same"')
    assert 'class="tok div"' in html
    assert "<rect" in html  # the divergence-position chart has bars
    # Markdown for CI job pages.
    md = render_markdown(report)
    assert md.startswith("## Parity verdict:") and "FAIL" in md
    assert "| broken | hard | 2 |" in md and "| lost | error" in md
    paths = write_report_files(store, run_id, tmp_path / "out")
    assert sorted(p.name for p in paths.values()) == ["report.html", "report.json", "report.md"]
    assert all(p.stat().st_size > 0 for p in paths.values())
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_a_run_from_another_host_without_heartbeat_reads_as_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite3"
    store = Store(db)
    fresh, stale = new_run(store, ["a"]), new_run(store, ["a"])
    raw = sqlite3.connect(db)
    with raw:  # as if two containers (other hosts, pid namespaces) own them; one went silent
        raw.execute(
            "UPDATE runs SET owner_host='container-1', owner_ns='elsewhere',"
            " owner_id='other', lease_expires_at=? WHERE id=?",
            (time.time() + 30, fresh),
        )
        raw.execute(
            "UPDATE runs SET owner_host='container-2', owner_ns='elsewhere',"
            " owner_id='other', lease_expires_at=? WHERE id=?",
            (time.time() - 5, stale),
        )
    raw.close()
    assert store.get_run(fresh).status == "running"
    with pytest.raises(ValueError, match="still running"):
        store.claim_for_resume(fresh)  # its owner's lease holds: not ours to take
    record = store.get_run(stale)
    assert record.status == "interrupted"
    assert "the lease of container-2" in record.error and "expired" in record.error
    with pytest.raises(LeaseLost):
        store.heartbeat(fresh)  # another process's run: this one cannot renew it


def test_a_pair_runs_once_across_stores_and_a_lost_lease_stops_writes(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite3"
    first, second = Store(db), Store(db)
    corpus = parse_corpus(corpus_bytes(["a"]), source="unit.jsonl")
    policy = parse_policy(POLICY_TEXT, source="unit.yaml")
    targets = Targets.from_urls("http://127.0.0.1:1", "http://127.0.0.1:2")
    run_id = start_run(first, corpus, policy, targets, pair="gpu0", exclusive=True)
    with pytest.raises(PairBusy, match=run_id):
        start_run(second, corpus, policy, targets, pair="gpu0", exclusive=True)
    start_run(second, corpus, policy, targets, pair="gpu1", exclusive=True)  # another pair
    start_run(second, corpus, policy, targets)  # CLI runs are not exclusive
    raw = sqlite3.connect(db)
    with raw:  # the owner stalls past its lease, in another pid namespace
        raw.execute(
            "UPDATE runs SET owner_ns='elsewhere', owner_id='stalled',"
            " lease_expires_at=? WHERE id=?",
            (time.time() - 1, run_id),
        )
    raw.close()
    taken = start_run(second, corpus, policy, targets, pair="gpu0", exclusive=True)
    assert first.get_run(run_id).status == "interrupted"
    assert second.get_run(taken).status == "running"
    with pytest.raises(ValueError, match=f"another run in progress: {taken}"):
        second.claim_for_resume(run_id)  # a resume takes the pair too
    second.finish_run(taken, "error", error="done")
    assert second.claim_for_resume(run_id).status == "running"
    raw = sqlite3.connect(db)
    with raw:  # someone else takes the run over
        raw.execute("UPDATE runs SET owner_id='someone-else' WHERE id=?", (run_id,))
    raw.close()
    with pytest.raises(LeaseLost):
        second.save_result(run_id, 0, exact("a"))
    with pytest.raises(LeaseLost):
        second.finish_run(run_id, "passed")
    assert second.results(run_id) == []
    first.close()
    second.close()


def _open_store_at_once(path: str, barrier: Any, errors: Any) -> None:
    barrier.wait()
    try:
        Store(path).close()
    except Exception as exc:  # reported to the parent, which asserts there are none
        errors.put(repr(exc))


def test_processes_creating_one_store_at_once_all_open_it(tmp_path: Path) -> None:
    # Two gate services started together create the database together. Switching a new file to
    # WAL needs the exclusive lock, and SQLite refuses the losers at once instead of waiting.
    # Without the store's own wait this failed about one round in thirty here.
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    for round_ in range(40):
        path = str(tmp_path / f"runs-{round_}.sqlite3")
        barrier = context.Barrier(6)
        workers = [
            context.Process(target=_open_store_at_once, args=(path, barrier, errors))
            for _ in range(6)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [w.exitcode for w in workers] == [0] * 6
        assert errors.empty(), errors.get()
        store = Store(path, read_only=True)
        assert store.list_runs() == []
        store.close()


def test_read_only_stores_create_nothing_and_refuse_what_is_not_a_run_database(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "typo" / "x.sqlite3"
    with pytest.raises(StoreError, match="no run database"):
        Store(missing, read_only=True)
    assert not (tmp_path / "typo").exists()
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not sqlite at all\n" * 100)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        Store(junk, read_only=True)
    other = tmp_path / "other.sqlite3"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(StoreError, match="not a kdtree-parity run database"):
        Store(other, read_only=True)
    db = tmp_path / "runs.sqlite3"
    writer = Store(db)
    run_id = new_run(writer, ["a"])
    raw = sqlite3.connect(db)
    with raw:
        raw.execute(
            "UPDATE runs SET owner_ns='elsewhere', lease_expires_at=0 WHERE id=?", (run_id,)
        )
    raw.close()
    reader = Store(db, read_only=True)
    assert reader.get_run(run_id).status == "interrupted"  # shown as what it is ...
    raw = sqlite3.connect(db)
    assert raw.execute("SELECT status FROM runs").fetchone()[0] == "running"  # ... not written
    raw.close()
    reader.close()
    writer.close()


def test_html_escapes_what_the_servers_and_corpus_send(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.sqlite3")
    run_id = new_run(store, ["x"])
    evil = replace(generation([1, 2]), token_texts=("<script>alert(1)</script>", "<img src=x>"))
    r = result("x", ok(generation([1, 3])), ok(evil))
    r = replace(r, entry=CorpusEntry(id="x", text="</pre><script>bad()</script>", line=1))
    store.save_result(run_id, 0, r)
    finish(store, run_id, 1)
    html = render_html(build_report(store, run_id))
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_committed_json_schema_matches_the_models() -> None:
    """report/report.schema.json documents report.json; regenerate with `kdtree-parity schema`."""
    committed = Path(__file__).resolve().parents[2] / (
        "services/parity/kdtree_parity/report/report.schema.json"
    )
    assert json.loads(committed.read_text()) == Report.model_json_schema()


def test_report_comparison_nulls_infinite_gaps_and_keeps_drift() -> None:
    """A gap against a token the other side never ranked is -inf: JSON gets null, not a crash."""
    from kdtree_parity.compare import PairComparison
    from kdtree_parity.report.schema import ComparisonModel

    pc = PairComparison(
        exact=False,
        common_prefix_len=3,
        first_divergence=3,
        divergence_class="hard",
        divergence_reason="gap",
        len_a=8,
        len_b=8,
        finish_a="length",
        finish_b="length",
        token_a=5,
        token_b=6,
        gap_a=float("-inf"),
        gap_b=0.25,
        drift_values=(0.5, 0.25, 0.0),
    )
    model = ComparisonModel.model_validate(pc, from_attributes=True)
    assert model.gap_a is None and model.gap_b == 0.25
    assert (model.drift.count, model.drift.max) == (3, 0.5)
    assert json.loads(model.model_dump_json())["gap_a"] is None


def nan_candidate(pid: str):
    """A result as the replay stored it before NaN logprobs were refused."""
    nan = replace(generation([1, 2]), token_logprobs=(float("nan"), -0.1))
    return result(pid, ok(generation([1, 2])), ok(nan))


def test_stored_results_are_judged_by_todays_answer_rules() -> None:
    from kdtree_parity.results import PromptResult

    legacy = nan_candidate("n")
    assert not legacy.has_error and legacy.candidate is not None  # what was stored
    read_back = PromptResult.from_json(json.loads(json.dumps(legacy.to_json())))
    error = read_back.outcomes["candidate"].error
    assert error is not None and error.kind == "malformed" and "logprob is nan" in error.message
    assert read_back.candidate is None and read_back.aa is not None
    assert PromptResult.from_json(exact("e").to_json()) == exact("e")


def test_answers_missing_logprobs_are_malformed_when_judged() -> None:
    from kdtree_parity.results import build_prompt_result

    entry = CorpusEntry(id="x", text="x", line=1)
    base = generation([1, 2, 3])
    hidden = replace(base, token_logprobs=(-0.1, float("-inf"), float("-inf")))
    judged = build_prompt_result(
        entry, {"baseline": ok(base), "candidate": ok(hidden), "aa": ok(hidden)}, 0.05
    )
    for role in ("candidate", "aa"):
        error = judged.outcomes[role].error
        assert error is not None and error.kind == "malformed", role
        assert "2 of 3 chosen-token logprobs are missing" in error.message
    assert judged.candidate is None and judged.aa is None and judged.has_error
    fine = build_prompt_result(
        entry, {"baseline": ok(base), "candidate": ok(base), "aa": ok(base)}, 0.05
    )
    assert not fine.has_error and fine.candidate is not None and fine.candidate.exact


def test_stored_runs_holding_nan_or_an_infinite_threshold_still_report(tmp_path: Path) -> None:
    """Before: json.dumps(allow_nan=False) raised in every rendering of such a run, so the
    CLI printed a traceback and the service answered 500."""
    from fastapi.testclient import TestClient

    from kdtree_parity.policy import LoadedPolicy
    from kdtree_parity.service import ServiceSettings, create_app

    store = Store(tmp_path / "runs.sqlite3")
    old_policy = LoadedPolicy(
        parse_policy(POLICY_TEXT).policy, "old.yaml", "gate:\n  max_logprob_drift_p99: .inf\n"
    )
    corpus = parse_corpus(corpus_bytes(["n", "a"]), source="unit.jsonl")
    targets = Targets.from_urls("http://127.0.0.1:1", "http://127.0.0.1:2")
    nan_run = start_run(store, corpus, parse_policy(POLICY_TEXT, "unit.yaml"), targets)
    inf_run = start_run(store, corpus, old_policy, targets)
    for run_id in (nan_run, inf_run):
        store.save_result(run_id, 0, nan_candidate("n"))
        store.save_result(run_id, 1, exact("a"))
        store.finish_run(run_id, "error", error="ValueError: Out of range float values ...")
    nan_report = build_report(store, nan_run)
    assert json.loads(report_json(nan_report))["summary"]["errors"]["candidate"] == {"malformed": 1}
    assert nan_report.verdict.status == "fail"  # judged today: a malformed candidate answer
    inf_report = build_report(store, inf_run)
    assert inf_report.policy.settings is None
    assert "old.yaml:2: gate.max_logprob_drift_p99" in (inf_report.policy.refused or "")
    assert "finite number" in (inf_report.policy.refused or "")
    assert inf_report.verdict.status == "error"
    for report in (nan_report, inf_report):
        json.loads(report_json(report))
        render_html(report)
        assert "Stored policy refused" in render_markdown(inf_report)
    settings = ServiceSettings(
        token="t",
        pairs={"default": targets},
        corpus="short",
        policy="short",
        db=str(tmp_path / "runs.sqlite3"),
        out=str(tmp_path / "out"),
    )
    with TestClient(create_app(settings)) as client:
        for run_id in (nan_run, inf_run):
            assert client.get(f"/runs/{run_id}/report.json").status_code == 200
            assert client.get(f"/runs/{run_id}/report.html").status_code == 200
    store.close()
