"""The gate against real reference engines on loopback: long contexts, chat traffic, targets
that want a bearer token, accept length, and what the gate says while it waits and replays.

A candidate whose attention is wrong only past the longest prompt of the ``default`` corpus
(``KDTREE_INJECT_FAULT=kv_drop:P``: the KV row at position P is lost) passes with that corpus
and fails with a long-context one, through the long bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from parity_support import only_report, write_inputs

from kdtree_inference.engine.launch import free_port
from kdtree_parity.corpus import load_corpus
from kdtree_parity.policy import load_policy, parse_policy

pytestmark = pytest.mark.slow

# Past the default corpus's longest prompt (5,164 bytes + BOS) and the tokens generated after it.
FAULT_POSITION = 5300
LONG_ENGINE = {"context_length": 8192, "max_prompt_tokens": 8000}


def gate(
    baseline: str,
    candidate: str,
    corpus: str | Path,
    policy: Path,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    progress: bool = False,
) -> subprocess.CompletedProcess:
    """``kdtree-parity run`` in a subprocess (stderr not a terminal), with ``env`` added."""
    out, db = tmp_path / "out", tmp_path / "runs.sqlite3"
    command = [sys.executable, "-m", "kdtree_parity.cli", "run", "--baseline", baseline]
    command += ["--candidate", candidate, "--corpus", str(corpus), "--policy", str(policy)]
    command += ["--out", str(out), "--db", str(db)] + ([] if progress else ["--no-progress"])
    return subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}
    )


def policy_file(directory: Path, min_prompts: int, **gate_keys: object) -> Path:
    """DIRECTORY/policy.yaml: the short policy's strict float32 thresholds, 4 new tokens, no
    speed rule, ``gate_keys`` over them."""
    data = yaml.safe_load(load_policy("short").text)
    data["replay"] |= {"max_new_tokens": 4, "health_deadline_s": 60}
    data["gate"] |= {"min_prompts": min_prompts, "max_slowdown": None} | gate_keys
    text = yaml.safe_dump(data)
    parse_policy(text)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "policy.yaml"
    path.write_text(text)
    return path


def failing(report: dict) -> list[str]:
    return [r["rule"] for r in report["verdict"]["reasons"] if r["outcome"] != "pass"]


def test_a_fault_past_the_default_corpus_passes_it_and_fails_the_long_corpus(
    reference_server, tmp_path: Path
) -> None:
    baseline = reference_server(**LONG_ENGINE)
    candidate = reference_server(
        env={"KDTREE_INJECT_FAULT": f"kv_drop:{FAULT_POSITION}"}, **LONG_ENGINE
    )
    default = load_corpus("default")
    assert max(e.max_prompt_tokens for e in default.entries) + 4 < FAULT_POSITION
    short_run = tmp_path / "default"
    done = gate(baseline, candidate, "default", policy_file(short_run, 200), short_run)
    assert done.returncode == 0, done.stdout + done.stderr
    report = only_report(short_run / "out")
    assert report["context"]["longest_prompt_tokens"] == 5165
    assert report["summary"]["candidate"]["exact"] == len(default)

    base = tmp_path / "base.jsonl"
    base.write_text("\n".join(load_corpus("short").raw.decode().splitlines()[:4]) + "\n")
    corpus = tmp_path / "long.jsonl"
    generate = ["corpus", "long", "--out", corpus, "--buckets", "1024,6144", "--per-bucket", "1"]
    made = subprocess.run(
        [sys.executable, "-m", "kdtree_parity.cli", *map(str, generate), "--base", str(base)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    long_run = tmp_path / "long"
    policy = policy_file(long_run, 6, min_context_tokens=6000)
    done = gate(baseline, candidate, corpus, policy, long_run)
    assert done.returncode == 1, done.stdout + done.stderr
    report = only_report(long_run / "out")
    assert "bucket 8k" in failing(report), report["verdict"]["reasons"]
    assert "bucket 1k" not in failing(report) and "bucket short" not in failing(report)
    context = report["context"]
    assert context["longest_prompt_tokens"] == 6144 and context["min_context_tokens"] == 6000
    buckets = {b["label"]: b for b in context["buckets"]}
    assert (buckets["8k"]["status"], buckets["1k"]["status"]) == ("fail", "pass")
    assert (
        buckets["8k"]["candidate"]["drift"]["max"] > 0 == buckets["1k"]["candidate"]["drift"]["max"]
    )
    assert "bucket 8k" in done.stdout
    run_dir = long_run / "out" / report["run"]["id"]
    assert "Context-length buckets" in (run_dir / "report.html").read_text()
    assert "| 8k | 1 | 6144-6144 |" in (run_dir / "report.md").read_text()


def test_a_token_protected_target_works_with_its_token_and_is_refused_without(
    reference_server, tmp_path: Path
) -> None:
    secret = "kdtree-test-secret-4711"
    engine_env = {"KDTREE_ENGINE_API_KEY": secret}
    baseline, candidate = reference_server(env=engine_env), reference_server(env=engine_env)
    # The engine guards what SGLang's --api-key guards: probes stay open.
    assert httpx.get(f"{baseline}/metrics").status_code == 200
    assert httpx.get(f"{baseline}/model_info").status_code == 401
    authorized = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{baseline}/model_info", headers=authorized).status_code == 200
    corpus, policy = write_inputs(tmp_path, 4)
    token_file = tmp_path / "candidate.token"
    token_file.write_text(secret + "\n")
    tokens = {
        "KDTREE_PARITY_BASELINE_TOKEN": secret,
        "KDTREE_PARITY_CANDIDATE_TOKEN_FILE": str(token_file),
        "KDTREE_PARITY_PROGRESS_EVERY": "2",
    }
    with_token = tmp_path / "with"
    done = gate(baseline, candidate, corpus, policy, with_token, tokens, progress=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # Without a terminal, progress comes as lines.
    assert "replay: 2/4 prompts" in done.stderr and "replay: 4/4 prompts" in done.stderr
    report = only_report(with_token / "out")
    assert report["summary"]["candidate"]["exact"] == 4
    without = tmp_path / "without"
    refused = gate(
        baseline, candidate, corpus, policy, without, {"KDTREE_PARITY_BASELINE_TOKEN": secret}
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        f"candidate ({candidate}) refused the gate with HTTP 401: it requires a bearer token: "
        "set KDTREE_PARITY_CANDIDATE_TOKEN or KDTREE_PARITY_CANDIDATE_TOKEN_FILE"
    ) in refused.stdout
    wrong = tmp_path / "wrong"
    bad = {"KDTREE_PARITY_BASELINE_TOKEN": secret, "KDTREE_PARITY_CANDIDATE_TOKEN": "nope"}
    done = gate(baseline, candidate, corpus, policy, wrong, bad)
    assert done.returncode == 2 and "does not accept the bearer token" in done.stdout
    # The token is nowhere: not in the run database, the reports, or what the gate printed.
    for run in (with_token, without, wrong):
        for path in [run / "runs.sqlite3", *(run / "out").rglob("*")]:
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    for output in (done, refused):
        assert secret not in output.stdout + output.stderr


def test_a_candidate_accepting_fewer_drafts_fails_on_accept_length(
    reference_server, tmp_path: Path
) -> None:
    """A draft tree of 2 tokens instead of 8: the same greedy tokens, fewer accepted per step."""
    baseline = reference_server()
    candidate = reference_server(speculative_num_draft_tokens=2)
    corpus, _ = write_inputs(tmp_path, 8)
    policy = policy_file(tmp_path / "run", 8, max_accept_length_drop=0.05)
    done = gate(baseline, candidate, corpus, policy, tmp_path / "run")
    assert done.returncode == 1, done.stdout + done.stderr
    report = only_report(tmp_path / "run" / "out")
    assert failing(report) == ["accept_length"], report["verdict"]["reasons"]
    assert report["summary"]["candidate"]["exact"] == 8
    means = {a["role"]: a["mean"] for a in report["context"]["accept_length"]}
    assert means["candidate"] < 0.95 * means["baseline"]
    sides = [s for p in report["prompts"] for s in p["sides"]]
    assert all(s["accept_length"] and s["spec_verify_ct"] and s["prompt_tokens"] for s in sides)


def test_waiting_for_a_target_says_so_every_few_seconds(tmp_path: Path) -> None:
    down, also_down = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    corpus, policy = write_inputs(tmp_path, 2, health_deadline_s=12)
    done = gate(down, also_down, corpus, policy, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    waiting = [line for line in done.stderr.splitlines() if "waiting for baseline" in line]
    assert len(waiting) >= 2, done.stderr
    assert f"waiting for baseline ({down}) to be healthy: ConnectError" in waiting[0]


def test_chat_lines_replay_through_chat_completions(reference_server, tmp_path: Path) -> None:
    """Needs the engine's /v1/chat/completions (return_meta_info, return_token_ids)."""
    baseline, candidate = reference_server(), reference_server()
    messages = [
        [{"role": "user", "content": "Name three primes."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
        [{"role": "user", "content": [{"type": "text", "text": "def fib(n):"}]}],
    ]
    lines = [json.dumps({"id": f"chat-{i}", "messages": m}) for i, m in enumerate(messages)]
    lines += load_corpus("short").raw.decode().splitlines()[:2]
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    done = gate(baseline, candidate, corpus, policy_file(tmp_path / "run", 5), tmp_path / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    report = only_report(tmp_path / "run" / "out")
    assert report["summary"]["candidate"]["exact"] == 5
    for prompt in report["prompts"][:3]:
        side = prompt["sides"][0]
        content = sum(len(_text(m["content"])) for m in messages[int(prompt["id"][-1])])
        # The server applied its chat template: more prompt tokens than the messages' bytes.
        assert side["prompt_tokens"] > content + 1 and side["output_ids"], side


def _text(content: str | list[dict]) -> str:
    return content if isinstance(content, str) else "".join(part["text"] for part in content)
