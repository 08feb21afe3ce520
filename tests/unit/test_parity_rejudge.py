"""`kdtree-parity judge`: a stored run decided again under another policy, replaying nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from parity_factories import exact, ok, result

from kdtree_parity.corpus import parse_corpus
from kdtree_parity.gate import decide, summarize
from kdtree_parity.generation import Generation, TopLogprob
from kdtree_parity.policy import parse_policy
from kdtree_parity.runner import start_run, verdict_to_json
from kdtree_parity.store import Store
from kdtree_parity.targets import Targets

STORED_POLICY = (
    "compare:\n  near_tie_epsilon: 0.25\n"
    "gate:\n  min_prompts: 2\n  min_exact_match_rate: 0.5\n  max_excess_divergence_rate: 1.0\n"
)
WIDER_POLICY = STORED_POLICY.replace("0.25", "0.5")


def tie(ids: list[int], other: int, gap: float) -> Generation:
    """Chosen tokens at logprob -10, ``other`` ``gap`` nats below at the last position."""
    tops = [(TopLogprob(t, -10.0),) for t in ids[:-1]]
    tops.append((TopLogprob(ids[-1], -10.0), TopLogprob(other, -10.0 - gap)))
    return Generation(
        output_ids=tuple(ids),
        token_logprobs=tuple(-10.0 for _ in ids),
        top_logprobs=tuple(tops),
        token_texts=tuple(None for _ in ids),
        finish_reason="length",
    )


def stored_run(tmp_path: Path, finished: bool = True) -> tuple[Path, str]:
    """A run of two prompts under STORED_POLICY: one exact, one flip two steps of 0.25 wide."""
    db = tmp_path / "runs.sqlite3"
    store = Store(db)
    corpus = parse_corpus(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n', source="c.jsonl")
    policy = parse_policy(STORED_POLICY, source="stored.yaml")
    run_id = start_run(
        store, corpus, policy, Targets.from_urls("http://127.0.0.1:1", "http://127.0.0.1:2")
    )
    flip = result("b", ok(tie([1, 2, 3], 4, 0.5)), ok(tie([1, 2, 4], 3, 0.5)), epsilon=0.25)
    store.save_result(run_id, 0, exact("a"))
    store.save_result(run_id, 1, flip)
    if finished:
        verdict = decide(summarize(store.results(run_id), 2), policy.policy.gate)
        assert verdict.status == "fail"  # the flip is hard at 0.25
        store.finish_run(run_id, "failed", verdict=verdict_to_json(verdict))
    store.close()
    return db, run_id


def judge(db: Path, run_id: str, policy: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kdtree_parity.cli",
            "judge",
            run_id,
            "--policy",
            policy,
            "--db",
            db,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_wider_near_tie_passes_what_the_stored_policy_failed(tmp_path: Path) -> None:
    db, run_id = stored_run(tmp_path)
    wider = tmp_path / "wider.yaml"
    wider.write_text(WIDER_POLICY)
    done = judge(db, run_id, wider)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"verdict: PASS (run {run_id} under {wider}" in done.stdout
    assert "stored verdict under stored.yaml: failed" in done.stdout
    assert "ok hard_divergences: 0 hard divergence(s)" in done.stdout

    same = tmp_path / "same.yaml"
    same.write_text(STORED_POLICY)
    again = judge(db, run_id, same)
    assert again.returncode == 1 and "FAIL hard_divergences: 1 hard" in again.stdout

    # The stored run keeps its own verdict.
    store = Store(db, read_only=True)
    record = store.get_run(run_id)
    store.close()
    assert record.status == "failed" and record.verdict["status"] == "fail"


def test_replay_settings_that_cannot_apply_are_named(tmp_path: Path) -> None:
    db, run_id = stored_run(tmp_path)
    longer = tmp_path / "longer.yaml"
    longer.write_text("replay:\n  max_new_tokens: 99\n" + WIDER_POLICY)
    done = judge(db, run_id, longer)
    assert done.returncode == 0
    assert "not applied (the answers are stored): replay.max_new_tokens" in done.stderr


def test_runs_without_a_verdict_and_unknown_runs_are_refused(tmp_path: Path) -> None:
    db, run_id = stored_run(tmp_path, finished=False)
    policy = tmp_path / "p.yaml"
    policy.write_text(WIDER_POLICY)
    running = judge(db, run_id, policy)
    assert running.returncode == 2
    assert f"run {run_id} ended running, without a verdict to revisit" in running.stderr
    unknown = judge(db, "no-such-run", policy)
    assert unknown.returncode == 2 and "no run no-such-run in" in unknown.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"gate": {"min_prompts": -1}}))
    refused = judge(db, run_id, bad)
    assert refused.returncode == 2 and "min_prompts" in refused.stderr
