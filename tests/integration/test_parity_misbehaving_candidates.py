"""Candidates that try to pass the gate by answering wrongly, against real reference engines.

Each candidate sits behind the loopback proxy, which rewrites its real answers: chosen-token
logprobs nulled, -inf or NaN (so no drift could be measured), the right tokens with the wrong
finish reason, 429/502 answers from a "load balancer". And a prompt that the baseline rejects as
well decides nothing. Each test states what the gate did before its rule existed.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from parity_proxy import ForwardingProxy
from parity_support import only_report, run_cli, run_gate, write_inputs

from kdtree_parity.client import TargetClient, build_generate_request
from kdtree_parity.corpus import load_corpus
from kdtree_parity.policy import ReplaySettings

pytestmark = pytest.mark.slow
PROMPTS = 6
DRIFT_GATE = {"max_logprob_drift_p99": 0.0005}  # the shipped short policy's threshold


@pytest.fixture(scope="module")
def pair(reference_server_module) -> tuple[str, str]:
    """A baseline and an identical second server, shared by this file's tests."""
    return reference_server_module(), reference_server_module()


@pytest.fixture(scope="module")
def perturbed(reference_server_module) -> str:
    """One layer's attention scaled by 1.001: every greedy token matches, the drift does not."""
    return reference_server_module(fault_layer=1, fault_scale=1.001)


def gate_run(
    tmp_path: Path, baseline: str, candidate: str, gate: dict | None = None, corpus_extra: str = ""
):
    corpus, policy = write_inputs(tmp_path, PROMPTS, gate=gate)
    if corpus_extra:
        corpus.write_text(corpus.read_text() + corpus_extra)
    out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
    done = run_gate(baseline, candidate, corpus, policy, out, db)
    return done, out, db


def outcomes(report: dict) -> dict[str, str]:
    return {r["rule"]: r["outcome"] for r in report["verdict"]["reasons"]}


def chosen_logprobs_set_to(value: float | None):
    def rewrite(answer: dict) -> None:
        for triple in answer["meta_info"]["output_token_logprobs"]:
            triple[0] = value

    return rewrite


def test_the_perturbed_candidate_fails_on_drift_when_served_directly(
    pair: tuple[str, str], perturbed: str, tmp_path: Path
) -> None:
    """The reference point for the next test: the same build, its answers untouched."""
    done, out, _ = gate_run(tmp_path, pair[0], perturbed, gate=DRIFT_GATE)
    assert done.returncode == 1, done.stdout + done.stderr
    assert outcomes(only_report(out))["logprob_drift_p99"] == "fail"


@pytest.mark.parametrize("value", [None, -math.inf], ids=["null", "-inf"])
def test_hiding_the_chosen_logprobs_is_a_malformed_answer(
    pair: tuple[str, str], perturbed: str, tmp_path: Path, value: float | None
) -> None:
    """Before: 0 drift samples, "p99 logprob drift 0", PASS."""
    proxy = ForwardingProxy(perturbed, rewrite=chosen_logprobs_set_to(value))
    try:
        done, out, _ = gate_run(tmp_path, pair[0], proxy.url, gate=DRIFT_GATE)
    finally:
        proxy.close()
    assert done.returncode == 1, done.stdout + done.stderr
    report = only_report(out)
    assert report["verdict"]["status"] == "fail"
    assert outcomes(report)["candidate_errors"] == "fail"
    assert report["summary"]["errors"]["candidate"] == {"malformed": PROMPTS}
    side = next(s for s in report["prompts"][0]["sides"] if s["role"] == "candidate")
    assert "chosen-token logprobs are missing" in side["error"]
    assert "candidate_errors: 6 candidate request(s)" in done.stdout


def test_drift_measured_nowhere_is_undecided(pair: tuple[str, str], tmp_path: Path) -> None:
    """Baseline and candidate both without logprobs: nothing to measure drift with. Before:
    PASS with "p99 logprob drift 0"."""
    proxies = [ForwardingProxy(url, rewrite=chosen_logprobs_set_to(None)) for url in pair]
    try:
        done, out, _ = gate_run(tmp_path, proxies[0].url, proxies[1].url)
    finally:
        for proxy in proxies:
            proxy.close()
    assert done.returncode == 2, done.stdout + done.stderr
    report = only_report(out)
    assert outcomes(report)["logprob_drift_p99"] == "undecided"
    assert outcomes(report)["candidate_errors"] == "pass"
    assert report["summary"]["candidate"]["drift"]["count"] == 0
    assert "logprob drift not measured" in done.stdout


def test_nan_logprobs_fail_and_every_report_renders(pair: tuple[str, str], tmp_path: Path) -> None:
    """Before: a traceback in the verdict output, the run left error, `report --format json`
    crashing (json.dumps refuses NaN)."""
    proxy = ForwardingProxy(pair[1], rewrite=chosen_logprobs_set_to(math.nan))
    try:
        done, out, db = gate_run(tmp_path, pair[0], proxy.url)
    finally:
        proxy.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    report = only_report(out)
    assert report["run"]["status"] == "failed"
    assert outcomes(report)["candidate_errors"] == "fail"
    side = next(s for s in report["prompts"][0]["sides"] if s["role"] == "candidate")
    assert "logprob is nan" in side["error"]
    shown = run_cli("report", report["run"]["id"], "--db", db, "--format", "json")
    assert shown.returncode == 1 and "Traceback" not in shown.stderr
    assert json.loads(shown.stdout)["verdict"]["status"] == "fail"


SWAPPED = {"length": "stop", "stop": "length"}


@pytest.mark.parametrize("finish", ["abort", "swapped"])
def test_the_right_tokens_with_the_wrong_finish_reason_fail(
    pair: tuple[str, str], tmp_path: Path, finish: str
) -> None:
    """Before: PASS; finish_differs appeared only inside report.json. "swapped": stop for
    length and length for stop."""

    def wrong_finish(answer: dict) -> None:
        real = answer["meta_info"]["finish_reason"]["type"]
        answer["meta_info"]["finish_reason"] = {
            "type": SWAPPED[real] if finish == "swapped" else finish
        }

    proxy = ForwardingProxy(pair[1], rewrite=wrong_finish)
    try:
        done, out, _ = gate_run(tmp_path, pair[0], proxy.url)
    finally:
        proxy.close()
    assert done.returncode == 1, done.stdout + done.stderr
    report = only_report(out)
    assert report["summary"]["candidate"]["exact"] == PROMPTS
    failing = [r["rule"] for r in report["verdict"]["reasons"] if r["outcome"] != "pass"]
    assert failing == ["finish_reasons"]
    assert report["summary"]["candidate"]["finish_mismatch"] == PROMPTS
    assert f"finish_reasons: {PROMPTS} prompt(s) with the baseline's tokens" in done.stdout
    run_dir = out / report["run"]["id"]
    md = (run_dir / "report.md").read_text()
    assert f"| same tokens, other finish reason | {PROMPTS} | 0 | {PROMPTS} |" in md
    first = report["prompts"][0]["id"]
    assert f"| {first} | exact |" in md  # listed among the prompts to look at
    html = (run_dir / "report.html").read_text()
    wrong = "stop" if finish == "swapped" else finish
    assert 'id="finish-mismatch"' in html and f"finish reason length vs {wrong}" in html


def test_a_prompt_the_baseline_rejects_too_leaves_the_run_undecided(
    pair: tuple[str, str], tmp_path: Path
) -> None:
    """One prompt over the engine's --max-prompt-tokens (2048 bytes by default), identical
    servers: both answer the same 400. Before: FAIL (exit 1), blaming the candidate."""
    too_long = json.dumps({"id": "too-long", "text": "x" * 3000}) + "\n"
    done, out, _ = gate_run(tmp_path, *pair, gate={"min_prompts": PROMPTS}, corpus_extra=too_long)
    assert done.returncode == 2, done.stdout + done.stderr
    report = only_report(out)
    assert report["verdict"]["status"] == "error"
    assert outcomes(report)["candidate_errors"] == "pass"
    assert outcomes(report)["undecidable_prompts"] == "undecided"
    (undecidable,) = report["summary"]["undecidable_prompts"]
    assert undecidable["id"] == "too-long" and "the limit is 2048" in undecidable["why"]
    line = next(x for x in done.stdout.splitlines() if "undecidable_prompts" in x)
    assert "too-long" in line and "HTTP 400" in line


def generate_once(url: str, **replay: object):
    settings = ReplaySettings(**{"retries": 2, "backoff_s": 0.01, **replay})
    body = build_generate_request(load_corpus("short").entries[0], settings)

    async def go():
        async with TargetClient("candidate", url, settings) as client:
            return await client.generate(body)

    return asyncio.run(go())


@pytest.mark.parametrize("status", [429, 502, 503])
def test_a_load_balancer_refusal_is_retried_after_its_retry_after(
    pair: tuple[str, str], status: int
) -> None:
    """Before: a 429 or a 502 was the candidate's final answer (an error, FAIL) at once."""
    proxy = ForwardingProxy(
        pair[1], unavailable_first=1, unavailable_status=status, retry_after="1"
    )
    try:
        outcome = generate_once(proxy.url)
    finally:
        proxy.close()
    assert outcome.error is None and outcome.generation is not None
    assert outcome.attempts == 2 and proxy.attempts == 2
    first, retry = proxy.arrived_at
    assert retry - first >= 1.0  # Retry-After honoured, not the 0.01 s backoff


def test_retry_after_is_bounded_and_a_persistent_refusal_still_counts(
    pair: tuple[str, str],
) -> None:
    proxy = ForwardingProxy(
        pair[1], unavailable_first=100, unavailable_status=502, retry_after="3600"
    )
    try:
        outcome = generate_once(proxy.url, max_retry_delay_s=0.3)
    finally:
        proxy.close()
    gaps = [b - a for a, b in zip(proxy.arrived_at, proxy.arrived_at[1:], strict=False)]
    assert len(gaps) == 2 and all(0.3 <= gap < 5 for gap in gaps)  # the cap, not an hour
    assert outcome.attempts == 3 and outcome.generation is None
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.status_code) == ("http", 502)
