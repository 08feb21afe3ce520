"""The parity sidecar against real reference-engine servers on loopback.

Identical servers pass; a candidate with a perturbed layer fails with named hard divergences
(and its HTML report renders in headless Chromium); a 0.1% perturbation that flips no token is
caught by logprob drift alone; a candidate killed mid-run gives an error
verdict and ``--resume`` (waiting for a restarted candidate's /health) then finishes the same
run; a slow candidate hits the timeout and is retried exactly as configured, as is a 503; a
SIGTERM mid-run leaves the run interrupted, never passed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from parity_proxy import ForwardingProxy
from parity_support import gate_command, listener_pid, only_report, run_cli, run_gate, write_inputs
from PIL import Image

from kdtree_parity.corpus import parse_corpus
from kdtree_parity.policy import parse_policy
from kdtree_parity.runner import execute_run, start_run
from kdtree_parity.store import AsyncStore, Store
from kdtree_parity.targets import Targets

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared_pair(reference_server_module) -> tuple[str, str]:
    """A baseline and an identical second server (same seed), shared by this file's tests."""
    return reference_server_module(), reference_server_module()


def test_identical_servers_pass(shared_pair: tuple[str, str], tmp_path: Path) -> None:
    baseline, candidate = shared_pair
    corpus, policy = write_inputs(tmp_path, 8)
    out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
    done = run_gate(
        baseline,
        candidate,
        corpus,
        policy,
        out,
        db,
        "--baseline-image",
        "sha256:base",
        "--candidate-image",
        "sha256:cand",
    )
    assert done.returncode == 0, done.stderr
    assert "verdict: PASS" in done.stdout
    report = only_report(out)
    assert report["verdict"]["status"] == "pass" and report["run"]["status"] == "passed"
    s = report["summary"]
    assert s["prompts_compared"] == 8 and s["candidate"]["exact"] == 8 and s["aa"]["exact"] == 8
    assert s["candidate"]["drift"]["max"] == 0.0 and s["candidate"]["drift"]["count"] > 0
    # A/A without a replica = the baseline replayed twice; identity comes from /model_info.
    targets = {t["role"]: t for t in report["targets"]}
    assert targets["aa"]["url"] == baseline
    assert targets["candidate"]["identity"]["model_info"]["served_model_name"]
    assert targets["candidate"]["identity"]["image"] == "sha256:cand"
    assert targets["aa"]["identity"]["image"] == targets["baseline"]["identity"]["image"]
    listed = run_cli("list", "--db", db)
    assert report["run"]["id"] in listed.stdout and "passed" in listed.stdout


def test_faulty_candidate_fails_with_named_hard_divergences(
    shared_pair: tuple[str, str], reference_server, tmp_path: Path
) -> None:
    baseline, replica = shared_pair
    candidate = reference_server(fault_layer=1, fault_scale=1.5)
    corpus, policy = write_inputs(tmp_path, 8)
    out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
    done = run_gate(baseline, candidate, corpus, policy, out, db, "--replica", replica)
    assert done.returncode == 1, done.stderr
    report = only_report(out)
    assert report["verdict"]["status"] == "fail"
    s = report["summary"]
    assert s["aa"]["exact"] == 8, "the replica is identical to the baseline"
    assert s["candidate"]["hard"] >= 1
    hard_ids = s["candidate"]["hard_prompt_ids"]
    reasons = {r["rule"]: r for r in report["verdict"]["reasons"]}
    assert reasons["hard_divergences"]["outcome"] == "fail"
    assert hard_ids[0] in reasons["hard_divergences"]["message"]
    first = next(p for p in report["prompts"] if p["id"] == hard_ids[0])
    assert first["status"] == "hard" and first["candidate"]["first_divergence"] is not None
    sides = {side["role"]: side for side in first["sides"]}
    assert sides["baseline"]["top_at_divergence"] and sides["candidate"]["top_at_divergence"]
    # The Markdown summary (CI job pages) names it too.
    md = run_cli("report", report["run"]["id"], "--db", db, "--format", "md")
    assert md.returncode == 1 and f"| {hard_ids[0]} | hard" in md.stdout
    check_html_in_chromium(out / report["run"]["id"] / "report.html", hard_ids[0], tmp_path)


def test_logprob_drift_catches_a_numerics_change_before_any_token_flips(
    shared_pair: tuple[str, str], reference_server, tmp_path: Path
) -> None:
    """A 0.1% perturbation of one layer: every greedy token still matches, the drift does not."""
    baseline, _ = shared_pair
    candidate = reference_server(fault_layer=1, fault_scale=1.001)
    corpus, policy = write_inputs(tmp_path, 8, gate={"max_logprob_drift_p99": 0.0005})
    out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
    done = run_gate(baseline, candidate, corpus, policy, out, db)
    assert done.returncode == 1, done.stderr
    report = only_report(out)
    s = report["summary"]
    assert s["candidate"]["exact"] == 8 and s["candidate"]["hard"] == 0
    assert s["aa"]["drift"]["max"] == 0.0
    assert s["candidate"]["drift"]["p99"] > 0.0005
    failing = [r["rule"] for r in report["verdict"]["reasons"] if r["outcome"] != "pass"]
    assert failing == [
        "logprob_drift_p99",
        "logprob_drift_tail",
        "logprob_drift_prompt_max",
    ]  # every drift rule, nothing else


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is required (scripts/setup_venv.sh installs it)"
    return path


def check_html_in_chromium(html: Path, divergent_id: str, tmp_path: Path) -> None:
    flags = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]
    dom = subprocess.run(
        [*flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Parity verdict: FAIL" in dom.stdout
    assert f'id="prompt-{divergent_id}"' in dom.stdout
    assert 'class="tok div"' in dom.stdout  # the first divergence is highlighted
    shot = tmp_path / "report.png"
    done = subprocess.run(
        [*flags, "--window-size=1200,900", f"--screenshot={shot}", html.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    # The verdict banner (fail = #b3261e) is painted at the top of the first screen.
    image = Image.open(shot).convert("RGB")
    top = image.crop((0, 0, image.width, 120))
    red = sum(1 for r, g, b in top.getdata() if abs(r - 0xB3) < 12 and g < 0x40 and b < 0x40)
    assert red > 10_000, f"only {red} verdict-red pixels at the top of the page"


def test_killed_candidate_gives_error_then_resume_finishes(
    shared_pair: tuple[str, str], reference_server, tmp_path: Path
) -> None:
    baseline, _ = shared_pair
    first_candidate = reference_server()
    victim = listener_pid(first_candidate)

    def kill_at_fourth_request(n: int) -> None:
        if n == 4:  # three candidate answers are in flight or done; the rest never come
            os.kill(victim, signal.SIGKILL)

    proxy = ForwardingProxy(first_candidate, on_generate=kill_at_fourth_request)
    try:
        corpus_path, policy_path = write_inputs(tmp_path, 8)
        store = Store(tmp_path / "runs.sqlite3")
        run_id = start_run(
            store,
            parse_corpus(corpus_path.read_bytes(), str(corpus_path)),
            parse_policy(policy_path.read_text(), str(policy_path)),
            Targets.from_urls(baseline, proxy.url),
            out_dir=str(tmp_path / "out"),
        )
        outcome = asyncio.run(execute_run(AsyncStore(store), run_id))
        assert outcome.status == "error" and outcome.verdict.status == "error", outcome
        assert "failed 2 requests in a row" in (outcome.error or ""), outcome
        record = store.get_run(run_id)
        assert record.status == "error" and record.prompts_ok < 8, record
        report = json.loads((tmp_path / "out" / run_id / "report.json").read_text())
        assert report["verdict"]["status"] == "error"
        reasons = {r["rule"]: r["outcome"] for r in report["verdict"]["reasons"]}
        assert reasons["complete"] == "undecided"

        # A fresh candidate behind the same address, still warming up (/health 503): --resume
        # waits for it, then replays only what is missing.
        proxy.upstream = reference_server(warmup_delay=3, wait_ready=False)
        assert httpx.get(proxy.url + "/health", timeout=10).status_code == 503
        done = run_cli(
            "run", "--resume", run_id, "--db", tmp_path / "runs.sqlite3", "--no-progress"
        )
        assert done.returncode == 0, done.stderr + done.stdout
        assert f"resuming run {run_id}: {record.prompts_ok}/8" in done.stderr
        report = json.loads((tmp_path / "out" / run_id / "report.json").read_text())
        assert report["verdict"]["status"] == "pass"
        assert report["summary"]["prompts_compared"] == 8
        store.close()
    finally:
        proxy.close()


def test_slow_candidate_hits_timeout_and_retries_as_configured(
    shared_pair: tuple[str, str], tmp_path: Path
) -> None:
    baseline, candidate = shared_pair
    # Every candidate request's first attempt is held 6 s; the timeout is 3 s, one retry.
    # Two-token generations keep real answers far below the timeout on a loaded 2-core box.
    proxy = ForwardingProxy(candidate, delay_s=6.0, slow_first=1)
    try:
        corpus, policy = write_inputs(tmp_path, 3, timeout_s=3, max_new_tokens=2)
        out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
        started = time.monotonic()
        done = run_gate(baseline, proxy.url, corpus, policy, out, db)
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started > 3
        report = only_report(out)
        candidate_sides = [
            side for p in report["prompts"] for side in p["sides"] if side["role"] == "candidate"
        ]
        assert [side["attempts"] for side in candidate_sides] == [2, 2, 2]
        assert sorted(proxy.generate_bodies.values()) == [2, 2, 2]

        # 503 (overloaded/starting) is retried too: every first attempt gets one, all pass.
        proxy.slow_first, proxy.unavailable_first = 0, 1
        proxy.generate_bodies.clear()
        done = run_gate(baseline, proxy.url, corpus, policy, tmp_path / "out503", db)
        assert done.returncode == 0, done.stderr
        report = only_report(tmp_path / "out503")
        attempts = [s["attempts"] for p in report["prompts"] for s in p["sides"]]
        assert sorted(attempts) == [1] * 6 + [2] * 3  # baseline and A/A once, candidate twice
        proxy.unavailable_first = 0

        # Always slow: each request is tried 1 + retries times, then the run stops undecided.
        proxy.slow_first = 10**6
        proxy.generate_bodies.clear()
        out2 = tmp_path / "out2"
        done = run_gate(baseline, proxy.url, corpus, policy, out2, db)
        assert done.returncode == 2, done.stderr
        report = only_report(out2)
        assert report["verdict"]["status"] == "error"
        assert set(proxy.generate_bodies.values()) == {2}
        errors = report["summary"]["errors"]["candidate"]
        assert errors == {"timeout": sum(errors.values())} and errors["timeout"] >= 2
        assert "failed 2 requests in a row" in report["run"]["error"]

        # SIGTERM while requests hang: the CLI records the run as interrupted and exits 2.
        out3 = tmp_path / "out3"
        proc = subprocess.Popen(
            gate_command(baseline, proxy.url, corpus, policy, out3, db),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        store = Store(db)
        deadline = time.monotonic() + 60
        while not any(r.status == "running" and r.out_dir == str(out3) for r in store.list_runs()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # requests are in flight (held by the proxy)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2, stderr
        assert "interrupted" in stderr
        record = next(r for r in store.list_runs() if r.out_dir == str(out3))
        assert record.status == "interrupted" and record.verdict is None
        assert only_report(out3)["verdict"]["status"] == "error"
        store.close()
    finally:
        proxy.close()


def test_shipped_short_policy_fails_a_perturbation_on_drift_alone_and_passes_the_op(
    shared_pair: tuple[str, str], reference_server, tmp_path: Path
) -> None:
    """The policy as shipped, on its corpus: A/A drift is exactly 0, so its drift threshold sits
    between the verify op's float32 rounding (KDTREE_VERIFY=on) and a 0.1% change of a layer."""
    baseline, _ = shared_pair
    op = reference_server(env={"KDTREE_VERIFY": "on"})
    perturbed = reference_server(fault_layer=1, fault_scale=1.001)
    verdicts, why = {}, {}
    for name, candidate in (("op", op), ("perturbed", perturbed)):
        out = tmp_path / name
        done = run_gate(baseline, candidate, "short", "short", out, tmp_path / "runs.sqlite3")
        report = only_report(out)
        why[name] = (report["verdict"]["reasons"], report["summary"], done.stderr[-2000:])
        assert report["summary"]["aa"]["drift"]["max"] == 0.0, why[name]
        assert report["summary"]["candidate"]["hard"] == 0, why[name]
        failing = [r["rule"] for r in report["verdict"]["reasons"] if r["outcome"] != "pass"]
        verdicts[name] = (done.returncode, failing)
    drift_rules = ["logprob_drift_p99", "logprob_drift_tail", "logprob_drift_prompt_max"]
    assert verdicts == {"op": (0, []), "perturbed": (1, drift_rules)}, why
