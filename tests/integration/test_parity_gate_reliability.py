"""The gate's verdict when something breaks, against real reference-engine servers on loopback.

A candidate that answers with errors fails (exit 1) while a failing baseline leaves the run
undecided (exit 2); a resume against a different build is refused unless the change is accepted
explicitly, and then it is in the report; outputs that cannot be written stop a run before it
replays anything, and a run whose reports cannot be written is never stored as passed; the
verdict goes to stdout, progress to stderr; bad arguments fail at once with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from parity_proxy import ForwardingProxy
from parity_support import gate_command, listener_pid, only_report, run_cli, run_gate, write_inputs

from kdtree_inference.engine.config import ModelConfig
from kdtree_inference.engine.model import save_weights, seeded_weights
from kdtree_parity.corpus import load_corpus, parse_corpus
from kdtree_parity.policy import parse_policy
from kdtree_parity.runner import execute_run, start_run
from kdtree_parity.store import AsyncStore, Store
from kdtree_parity.targets import Targets

pytestmark = pytest.mark.slow
PROMPTS = 6


@pytest.fixture(scope="module")
def pair(reference_server_module) -> tuple[str, str]:
    """A baseline and an identical second server, shared by this file's tests."""
    return reference_server_module(), reference_server_module()


def first_prompt_text() -> str:
    return load_corpus("short").entries[0].text


def gate_run(tmp_path: Path, baseline: str, candidate: str, *extra: str):
    """One CLI run over the first PROMPTS prompts, min_prompts = all of them."""
    corpus, policy = write_inputs(tmp_path, PROMPTS)
    out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
    done = run_gate(baseline, candidate, corpus, policy, out, db, *extra)
    return done, out


def reasons(report: dict) -> dict[str, str]:
    return {r["rule"]: r["outcome"] for r in report["verdict"]["reasons"]}


def answers_500_for_the_first_prompt(path: str, body: bytes) -> int | None:
    text = json.dumps(first_prompt_text())[1:-1].encode()
    return 500 if path == "/generate" and text in body else None


@pytest.mark.parametrize(
    "respond",
    [
        pytest.param(lambda path, body: 404, id="404-to-everything"),
        pytest.param(lambda path, body: 404 if path == "/generate" else None, id="404-generate"),
        pytest.param(answers_500_for_the_first_prompt, id="500-on-one-prompt"),
    ],
)
def test_a_candidate_answering_with_errors_fails_the_gate(
    pair: tuple[str, str], tmp_path: Path, respond
) -> None:
    baseline, candidate = pair
    proxy = ForwardingProxy(candidate, respond=respond)
    try:
        started = time.monotonic()
        done, out = gate_run(tmp_path, baseline, proxy.url)
    finally:
        proxy.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "verdict: FAIL" in done.stdout
    report = only_report(out)
    assert report["verdict"]["status"] == "fail" and report["run"]["status"] == "failed"
    assert reasons(report)["candidate_errors"] == "fail"
    assert "(0/0)" not in done.stdout
    if report["summary"]["prompts_compared"] == 0:
        assert "exact_match_rate: no prompt was compared on every target" in done.stdout
    # A refused /health fails at once: no waiting out the 60 s health deadline.
    assert time.monotonic() - started < 45


def test_a_baseline_answering_with_errors_leaves_the_run_undecided(
    pair: tuple[str, str], tmp_path: Path
) -> None:
    baseline, candidate = pair
    proxy = ForwardingProxy(baseline, respond=answers_500_for_the_first_prompt)
    try:
        done, out = gate_run(tmp_path, proxy.url, candidate)
    finally:
        proxy.close()
    assert done.returncode == 2, done.stdout + done.stderr
    report = only_report(out)
    assert report["verdict"]["status"] == "error"
    assert reasons(report)["baseline_errors"] == "undecided"
    assert reasons(report)["candidate_errors"] == "pass"


def test_resume_refuses_a_different_build_unless_told_and_then_reports_it(
    pair: tuple[str, str], reference_server, tmp_path: Path
) -> None:
    baseline, _ = pair
    first = reference_server()
    victim = listener_pid(first)

    def kill_at_fourth_request(n: int) -> None:
        if n == 4:
            os.kill(victim, signal.SIGKILL)

    proxy = ForwardingProxy(first, on_generate=kill_at_fourth_request)
    db = tmp_path / "runs.sqlite3"
    try:
        corpus_path, policy_path = write_inputs(tmp_path, PROMPTS)
        store = Store(db)
        run_id = start_run(
            store,
            parse_corpus(corpus_path.read_bytes(), str(corpus_path)),
            parse_policy(policy_path.read_text(), str(policy_path)),
            Targets.from_urls(baseline, proxy.url, images={"candidate": "sha256:one"}),
            out_dir=str(tmp_path / "out"),
        )
        assert asyncio.run(execute_run(AsyncStore(store), run_id)).status == "error"
        done_before = store.get_run(run_id).prompts_ok
        stored_before = store.results(run_id)
        assert done_before < PROMPTS

        # Another build behind the same address: a perturbed layer, and another image label.
        proxy.upstream = reference_server(fault_layer=1, fault_scale=1.2)
        refused = run_cli(
            "run",
            "--resume",
            run_id,
            "--db",
            db,
            "--no-progress",
            "--candidate-image",
            "sha256:two",
        )
        assert refused.returncode == 2, refused.stdout + refused.stderr
        message = refused.stderr.strip()
        assert "Traceback" not in message and "resume refused" in message
        assert "kdtree_engine.fault_layer: None -> 1" in message
        assert "image 'sha256:one' -> 'sha256:two'" in message
        record = store.get_run(run_id)
        assert record.status == "error" and record.prompts_ok == done_before
        assert store.results(run_id) == stored_before  # nothing of the new build is stored

        accepted = run_cli(
            "run", "--resume", run_id, "--db", db, "--no-progress", "--accept-identity-change"
        )
        assert accepted.returncode in (0, 1), accepted.stdout + accepted.stderr
        assert "resumed against a changed candidate" in accepted.stdout
        report = json.loads((tmp_path / "out" / run_id / "report.json").read_text())
        (change,) = report["identity_changes"]
        assert change["role"] == "candidate"
        assert any("fault_layer" in d for d in change["differences"])
        assert change["before"]["model_info"]["kdtree_engine"]["fault_layer"] is None
        candidate = next(t for t in report["targets"] if t["role"] == "candidate")
        assert candidate["identity"]["model_info"]["kdtree_engine"]["fault_layer"] == 1
        md = (tmp_path / "out" / run_id / "report.md").read_text()
        assert "Resumed against a changed candidate" in md
        store.close()
    finally:
        proxy.close()


def test_unwritable_outputs_stop_the_run_before_any_replay(
    pair: tuple[str, str], tmp_path: Path
) -> None:
    baseline, candidate = pair
    proxy = ForwardingProxy(candidate)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    corpus, policy = write_inputs(tmp_path, PROMPTS)
    db = tmp_path / "runs.sqlite3"
    common = (
        "--baseline",
        baseline,
        "--candidate",
        proxy.url,
        "--corpus",
        corpus,
        "--policy",
        policy,
        "--no-progress",
    )
    try:
        bad_out = run_cli("run", *common, "--out", blocker / "out", "--db", db, timeout=60)
        bad_db = run_cli(
            "run", *common, "--out", tmp_path / "out", "--db", blocker / "db", timeout=60
        )
    finally:
        proxy.close()
    for done, what in (
        (bad_out, "cannot write reports to"),
        (bad_db, "cannot use the run database"),
    ):
        assert done.returncode == 2, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and what in lines[0], done.stderr
        assert done.stdout == ""
    assert proxy.attempts == 0  # nothing was replayed
    store = Store(db)
    assert store.list_runs() == []
    store.close()


def test_a_run_whose_reports_cannot_be_written_is_not_passed(
    pair: tuple[str, str], tmp_path: Path
) -> None:
    baseline, candidate = pair
    corpus_path, policy_path = write_inputs(tmp_path, 3)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    store = Store(tmp_path / "runs.sqlite3")
    run_id = start_run(
        store,
        parse_corpus(corpus_path.read_bytes(), str(corpus_path)),
        parse_policy(policy_path.read_text(), str(policy_path)),
        Targets.from_urls(baseline, candidate),
        out_dir=str(blocker / "out"),  # the CLI would refuse this; the runner must cope too
    )
    outcome = asyncio.run(execute_run(AsyncStore(store), run_id))
    record = store.get_run(run_id)
    assert outcome.verdict is not None and outcome.verdict.status == "pass"
    assert outcome.status == record.status == "error"
    assert "the reports could not be written" in (record.error or "")
    store.close()


def test_verdict_on_stdout_progress_on_stderr(pair: tuple[str, str], tmp_path: Path) -> None:
    baseline, candidate = pair
    done, out = gate_run(tmp_path, baseline, candidate)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = only_report(out)["run"]["id"]
    assert done.stdout.startswith(f"verdict: PASS (run {run_id})")
    assert f"report: {out.resolve() / run_id / 'report.html'}" in done.stdout
    assert "verdict:" not in done.stderr and "report:" not in done.stderr
    assert f"run {run_id}: {PROMPTS} prompts" in done.stderr


def test_bad_arguments_fail_at_once_with_one_line(pair: tuple[str, str], tmp_path: Path) -> None:
    baseline, _ = pair
    db = tmp_path / "runs.sqlite3"
    nope = run_cli("run", "--resume", "nope", "--db", db, timeout=60)
    assert nope.returncode == 2
    assert nope.stderr.strip() == f"cannot resume nope: no such run in {db}"

    started = time.monotonic()
    done, _ = gate_run(tmp_path, baseline, "not-a-url")
    assert done.returncode == 2
    assert time.monotonic() - started < 30  # not the policy's 60 s health deadline
    assert done.stderr.strip() == (
        "--candidate: 'not-a-url' is not an http:// or https:// URL with a host"
    )


def test_resume_refuses_other_weights_after_the_sidecar_was_killed(
    pair: tuple[str, str], reference_server, tmp_path: Path
) -> None:
    """The candidate is restarted from another weights file while the sidecar is down: same
    address, same shape, same flags; only /model_info's weights digest tells them apart."""
    baseline, _ = pair
    a, b = tmp_path / "weights-a", tmp_path / "weights-b"
    save_weights(seeded_weights(ModelConfig(seed=11)), a)
    save_weights(seeded_weights(ModelConfig(seed=12)), b)
    first = reference_server(weights_dir=a)
    corpus, policy = write_inputs(tmp_path, PROMPTS)
    out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
    sidecar: list[subprocess.Popen] = []

    def kill_the_sidecar_at_the_fifth_request(n: int) -> None:
        if n != 5:
            return
        # Hold this request (the proxy's loop) until two prompts are stored, then kill.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.closing(sqlite3.connect(db)) as raw:
                if raw.execute("SELECT count(*) FROM results").fetchone()[0] >= 2:
                    break
            time.sleep(0.1)
        os.kill(sidecar[0].pid, signal.SIGKILL)

    proxy = ForwardingProxy(first, on_generate=kill_the_sidecar_at_the_fifth_request)
    try:
        sidecar.append(
            subprocess.Popen(
                gate_command(
                    baseline,
                    proxy.url,
                    corpus,
                    policy,
                    out,
                    db,
                    "--candidate-image",
                    "kdtree/inference:latest",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
        sidecar[0].communicate(timeout=300)
        assert sidecar[0].returncode == -signal.SIGKILL
        store = Store(db)
        (record,) = store.list_runs()
        assert record.status == "interrupted" and 0 < record.prompts_ok < PROMPTS
        recorded = record.targets["candidate"][1]["model_info"]["kdtree_engine"]
        assert recorded["weights_path"] == str((a / "model.safetensors").resolve())
        assert recorded["seed"] is None  # loaded from a file: no seed to speak of
        store.close()

        proxy.upstream = reference_server(weights_dir=b)
        refused = run_cli(
            "run",
            "--resume",
            record.id,
            "--db",
            db,
            "--no-progress",
            "--candidate-image",
            "kdtree/inference:latest",
        )
        assert refused.returncode == 2, refused.stdout + refused.stderr
        resuming, line = refused.stderr.strip().splitlines()  # the refusal is one line
        assert resuming.startswith(f"resuming run {record.id}: ")
        digest_a = hashlib.sha256((a / "model.safetensors").read_bytes()).hexdigest()
        digest_b = hashlib.sha256((b / "model.safetensors").read_bytes()).hexdigest()
        assert line.startswith(f"resume refused: run {record.id}")
        assert (
            f"candidate: /model_info kdtree_engine.weights_path: '{(a / 'model.safetensors').resolve()}'"
            in line
        )
        assert f"kdtree_engine.weights_sha256: '{digest_a}' -> '{digest_b}'" in line

        # The image label given when the run started must be given again, and be the same.
        unlabelled = run_cli("run", "--resume", record.id, "--db", db, "--no-progress")
        assert unlabelled.returncode == 2
        assert "image 'kdtree/inference:latest' -> (not given on the resume)" in unlabelled.stderr
        store = Store(db)
        record_after = store.get_run(record.id)
        assert record_after.prompts_ok == record.prompts_ok and not record_after.identity_changes
        store.close()
    finally:
        proxy.close()


def test_resume_refuses_a_target_whose_build_cannot_be_verified(
    pair: tuple[str, str], tmp_path: Path
) -> None:
    """Like SGLang, this candidate's /model_info carries no weights digest (here: none at all)
    and the run recorded no image digest: a resume cannot show it is the same build."""
    baseline, candidate = pair
    proxy = ForwardingProxy(
        candidate, respond=lambda path, body: 404 if path == "/model_info" else None
    )
    try:
        corpus_path, policy_path = write_inputs(tmp_path, 3)
        store = Store(tmp_path / "runs.sqlite3")
        run_id = start_run(
            store,
            parse_corpus(corpus_path.read_bytes(), str(corpus_path)),
            parse_policy(policy_path.read_text(), str(policy_path)),
            Targets.from_urls(baseline, proxy.url),
            out_dir=str(tmp_path / "out"),
        )
        assert asyncio.run(execute_run(AsyncStore(store), run_id)).status == "passed"
        raw = sqlite3.connect(tmp_path / "runs.sqlite3")
        with raw:  # a passed run is final; as an errored one it may be resumed
            raw.execute("UPDATE runs SET status='error' WHERE id=?", (run_id,))
        raw.close()
        store.close()
        refused = run_cli(
            "run", "--resume", run_id, "--db", tmp_path / "runs.sqlite3", "--no-progress"
        )
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert (
            "(candidate: cannot be verified: its /model_info has no weights digest"
            in refused.stderr
        )
    finally:
        proxy.close()
