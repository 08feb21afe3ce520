"""The gate's traffic: the long-context corpus, chat lines, context buckets and coverage, accept
length, per-target tokens and progress lines (the parts that need no server)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from parity_factories import exact, generation, hard, ok, result
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionTokenLogprob,
    ChatMessage,
    ChoiceLogprobs,
    TopLogprob,
    UsageInfo,
)

from kdtree_inference.engine.tokenizer import ByteTokenizer
from kdtree_parity.chat import build_chat_request, parse_chat_response
from kdtree_parity.client import build_request
from kdtree_parity.corpus import CorpusError, load_corpus, parse_corpus
from kdtree_parity.generation import MalformedResponse
from kdtree_parity.long_corpus import generate_entries, long_corpus_jsonl
from kdtree_parity.policy import parse_policy
from kdtree_parity.progress_lines import ProgressLines
from kdtree_parity.report.context import context_markdown, context_model
from kdtree_parity.results import PromptResult
from kdtree_parity.runner import RunRefused, prepare_run
from kdtree_parity.settings import ParitySettings, SettingsError, target_tokens
from kdtree_parity.verdict import judge


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kdtree_parity.cli", *map(str, args)],
        capture_output=True,
        text=True,
    )


# ---------------------------------------------------------------- the long corpus


def test_the_long_corpus_is_the_same_bytes_for_the_same_seed_and_sized_exactly() -> None:
    first = long_corpus_jsonl((300, 4000), per_bucket=3, seed=5, base=None)
    assert first == long_corpus_jsonl((300, 4000), per_bucket=3, seed=5, base=None)
    assert first != long_corpus_jsonl((300, 4000), per_bucket=3, seed=6, base=None)
    corpus = parse_corpus(first)
    # A byte tokenizer with a BOS (the reference engine) counts exactly the bucket.
    tokenizer = ByteTokenizer()
    assert [len(tokenizer.encode(e.text)) for e in corpus.entries] == [300] * 3 + [4000] * 3
    assert [e.tags for e in corpus.entries[:3]] == [
        ("long", "ctx-300", f"depth-{d}") for d in (10, 50, 90)
    ]
    # The needle sits at the stated depth and the question asks for it.
    for entry in corpus.entries[3:]:
        depth = int(entry.tags[2].split("-")[1]) / 100
        at = entry.text.index("NOTE: the access code of the ")
        assert abs(at / len(entry.text) - depth) < 0.08, (entry.id, at)  # a record or two
        vault = entry.text[at:].split(" vault")[0].removeprefix("NOTE: the access code of the ")
        assert entry.text.endswith(f"access code of the {vault} vault is")


def test_a_tokenizer_gives_input_ids_of_exactly_the_bucket() -> None:
    tokenizer = ByteTokenizer()
    entries = generate_entries(
        (512, 2048), per_bucket=2, encode=lambda s: tokenizer.encode(s, add_bos=False)
    )
    assert [len(e["input_ids"]) for e in entries] == [512, 512, 2048, 2048]
    text = tokenizer.decode(entries[1]["input_ids"])
    assert "NOTE: the access code of the" in text and text.endswith("vault is")


@pytest.mark.slow
def test_corpus_long_in_a_real_models_tokens(tmp_path: Path) -> None:
    """The GPU models' own tokenizer (bench/kdtree_bench/models/make_model.py's byte-level BPE, trained
    here): every prompt exactly its bucket in that tokenizer's ids, needle and question
    intact."""
    from transformers import AutoTokenizer

    from kdtree_bench.models import make_model

    model = tmp_path / "model"
    make_model.write_tokenizer(model, 262144)
    out = tmp_path / "long.jsonl"
    done = run_cli(
        "corpus", "long", "--out", out, "--tokenizer", model, "--buckets", "2048,20000",
        "--per-bucket", "2", "--base", "none",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    entries = load_corpus(out).entries
    assert [len(e.input_ids) for e in entries] == [2048, 2048, 20000, 20000]
    tokenizer = AutoTokenizer.from_pretrained(model)
    for entry in entries:
        text = tokenizer.decode(list(entry.input_ids))
        vault = text.split("NOTE: the access code of the ")[1].split(" vault")[0]
        assert text.endswith(f"Answer: the access code of the {vault} vault is"), entry.id


def test_the_shipped_long_corpus_starts_with_the_default_one_and_reaches_200k() -> None:
    long, default = load_corpus("long"), load_corpus("default")
    assert long.entries[: len(default)] == default.entries
    assert max(e.max_prompt_tokens for e in long.entries) == 200000
    assert {t for e in long.entries for t in e.tags if t.startswith("ctx-")} == {
        "ctx-1k",
        "ctx-8k",
        "ctx-32k",
        "ctx-128k",
        "ctx-200k",
    }


def test_corpus_long_command_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "long.jsonl"
    done = run_cli(
        "corpus", "long", "--out", out, "--buckets", "256,1024", "--per-bucket", "2",
        "--base", "short",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    corpus = load_corpus(out)
    assert len(corpus) == len(load_corpus("short")) + 4
    assert corpus.sha256 in done.stdout and "1024 tokens" in done.stdout
    bad = run_cli("corpus", "long", "--out", out, "--buckets", "1024,zero")
    assert bad.returncode == 2 and "positive token counts" in bad.stderr


def test_a_policy_needing_more_context_than_the_corpus_reaches_is_refused() -> None:
    policy = parse_policy("gate:\n  min_prompts: 1\n  min_context_tokens: 6000\n")
    with pytest.raises(RunRefused) as refused:
        prepare_run("default", policy, {})
    (problem,) = refused.value.problems
    assert "at most 5165 tokens" in problem and "min_context_tokens 6000" in problem
    long = parse_corpus(long_corpus_jsonl((6000,), per_bucket=1, base=None))
    assert prepare_run(long, policy, {}).corpus is long


def test_run_refuses_the_default_policy_with_a_short_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(load_corpus("default").raw)
    done = run_cli(
        "run", "--corpus", corpus, "--policy", "default", "--baseline", "http://127.0.0.1:9",
        "--candidate", "http://127.0.0.1:9", "--db", tmp_path / "db", "--out", tmp_path / "o",
    )  # fmt: skip
    assert done.returncode == 2
    assert "needs min_context_tokens 200000" in done.stderr, done.stderr
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


# ---------------------------------------------------------------- chat lines


def test_messages_lines_validate_and_mix_with_text() -> None:
    good = (
        b'{"id": "a", "text": "hi"}\n'
        b'{"id": "b", "messages": [{"role": "system", "content": "be brief"}, '
        b'{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}\n'
    )
    corpus = parse_corpus(good)
    assert [e.is_chat for e in corpus.entries] == [False, True]
    assert corpus.entries[1].prompt_preview == "system: be brief\nuser: hello"
    path, body = build_request(corpus.entries[1], parse_policy("").policy.replay)
    assert path == "/v1/chat/completions"
    assert body["temperature"] == 0 and body["logprobs"] is True and body["top_logprobs"] == 5
    assert body["return_token_ids"] is True and body["return_meta_info"] is True
    assert body["messages"][1]["content"][0]["text"] == "hello"
    assert build_request(corpus.entries[0], parse_policy("").policy.replay)[0] == "/generate"
    bad = (
        b'{"id": "c", "messages": []}\n'
        b'{"id": "d", "messages": [{"role": "robot", "content": "x"}]}\n'
        b'{"id": "e", "messages": [{"role": "user", "content": 5}]}\n'
        b'{"id": "f", "text": "x", "messages": [{"role": "user", "content": "x"}]}\n'
    )
    with pytest.raises(CorpusError) as info:
        parse_corpus(bad)
    assert [line for line, _ in info.value.problems] == [1, 2, 3, 4]
    assert "role must be one of" in str(info.value)


def _chat_body(meta: bool) -> dict:
    """A chat answer built with SGLang 0.5.23's own response models."""
    tops = [
        [TopLogprob(token="a", bytes=[97], logprob=-0.1), TopLogprob(token="b", bytes=[98], logprob=-2.0)],
        [TopLogprob(token="b", bytes=[98], logprob=-0.2), TopLogprob(token="c", bytes=[99], logprob=-1.5)],
    ]  # fmt: skip
    content = [
        ChatCompletionTokenLogprob(token=t, bytes=[ord(t)], logprob=lp, top_logprobs=top)
        for t, lp, top in (("a", -0.1, tops[0]), ("b", -0.2, tops[1]))
    ]
    meta_info = {
        "finish_reason": {"type": "length", "length": 2},
        "prompt_tokens": 17,
        "completion_tokens": 2,
        "spec_verify_ct": 1,
        "output_token_logprobs": [[-0.1, 97, "a"], [-0.2, 98, "b"]],
        "output_top_logprobs": [[[-0.1, 97, "a"], [-2.0, 98, "b"]], [[-0.2, 98, "b"], [-1.5, 99, "c"]]],
    }  # fmt: skip
    choice = ChatCompletionResponseChoice(
        index=0,
        message=ChatMessage(role="assistant", content="ab"),
        logprobs=ChoiceLogprobs(content=content),
        finish_reason="length",
        response_token_ids=[97, 98],
        meta_info=meta_info if meta else None,
    )
    usage = UsageInfo(prompt_tokens=17, completion_tokens=2, total_tokens=19)
    response = ChatCompletionResponse(id="x", model="m", choices=[choice], usage=usage)
    return json.loads(response.model_dump_json())


def test_a_chat_answer_with_meta_info_reads_as_a_generate_answer() -> None:
    g = parse_chat_response(_chat_body(meta=True))
    assert g.output_ids == (97, 98) and g.token_logprobs == (-0.1, -0.2)
    assert g.top_map(1) == {98: -0.2, 99: -1.5}
    assert (g.prompt_tokens, g.accept_length, g.finish_reason, g.text) == (17, 2.0, "length", "ab")


def test_a_chat_answer_without_meta_info_keeps_ids_and_chosen_logprobs() -> None:
    g = parse_chat_response(_chat_body(meta=False))
    assert g.output_ids == (97, 98) and g.token_logprobs == (-0.1, -0.2)
    assert g.top_logprobs == (None, None) and g.prompt_tokens == 17 and g.accept_length is None
    body = _chat_body(meta=False)
    del body["choices"][0]["response_token_ids"]
    with pytest.raises(MalformedResponse, match="no token ids to compare"):
        parse_chat_response(body)


def test_chat_requests_carry_the_entry_s_own_token_budget() -> None:
    entry = parse_corpus(
        b'{"id": "b", "max_new_tokens": 3, "messages": [{"role": "user", "content": "x"}]}\n'
    ).entries[0]
    assert build_chat_request(entry, parse_policy("").policy.replay)["max_completion_tokens"] == 3


# ---------------------------------------------------------------- buckets, coverage, accept


def _sized(r: PromptResult, tokens: int, verify: int | None = None, role: str = "") -> PromptResult:
    """``r`` with every answer reporting ``tokens`` prompt tokens (and, with ``verify``, that
    many verify steps on ``role``, or on every role when ``role`` is empty)."""
    outcomes = {}
    for name, outcome in r.outcomes.items():
        g = dataclasses.replace(outcome.generation, prompt_tokens=tokens, completion_tokens=4)
        if verify is not None and role in ("", name):
            g = dataclasses.replace(g, spec_verify_ct=verify)
        elif verify is not None:
            g = dataclasses.replace(g, spec_verify_ct=2)
        outcomes[name] = dataclasses.replace(outcome, generation=g)
    return dataclasses.replace(r, outcomes=outcomes)


def _gate(**keys: object):
    """A gate for 4+ prompts: one hard divergence allowed, up to 30% more diverging prompts."""
    gate = {"min_prompts": 4, "min_exact_match_rate": 0.6, "max_excess_divergence_rate": 0.3}
    gate |= {"max_hard_divergences": 1, "max_slowdown": None} | keys
    return parse_policy(json.dumps({"gate": gate})).policy.gate


def test_a_fault_only_in_the_long_bucket_fails_through_its_bucket() -> None:
    """The whole run (1 of 8 prompts diverging) is shown within the margins; the 8k bucket (1 of
    2) is not. (A margin wide enough for 8 prompts to show: the excess's interval is [0, 0.375].)"""
    results = [_sized(exact(f"s{i}"), 100) for i in range(6)]
    results += [_sized(hard("l0"), 8000)]
    results += [_sized(exact("l1"), 8001)]
    whole = judge(results, len(results), _gate(max_excess_divergence_rate=0.45))
    assert [r.rule for r in whole.verdict.failing] == ["bucket 8k"], whole.verdict.reasons
    assert whole.verdict.status == "fail"
    (bucket,) = [r for r in whole.verdict.reasons if r.rule == "bucket 8k"]
    assert "2 prompt(s), 8000-8001 tokens" in bucket.message
    assert "exact_match_rate FAIL" in bucket.message
    assert [b.label for b in whole.buckets] == ["short", "8k"]
    # The same results, the long one answered right: pass.
    fixed = [*results[:6], _sized(exact("l0"), 8000), results[7]]
    assert judge(fixed, len(fixed), _gate()).verdict.status == "pass"


def test_a_run_short_of_min_context_tokens_is_undecided() -> None:
    results = [_sized(exact(f"s{i}"), 3000) for i in range(4)]
    short = judge(results, 4, _gate(min_context_tokens=8000))
    (coverage,) = [r for r in short.verdict.reasons if r.rule == "context_coverage"]
    assert coverage.outcome == "undecided" and "longest prompt 3000 tokens" in coverage.message
    assert short.verdict.status == "error"
    # A candidate fault still fails (decide()'s precedence); and reaching it passes.
    failing = [*results[:3], _sized(hard("h"), 3000)]
    gate = _gate(min_context_tokens=8000, max_hard_divergences=0)
    assert judge(failing, 4, gate).verdict.status == "error"
    assert judge(results, 4, _gate(min_context_tokens=3000)).verdict.status == "pass"


def test_accept_length_below_the_floor_by_more_than_the_margin_fails() -> None:
    # Baseline 4 tokens in 2 steps (2.0); the candidate in 3 steps (1.33): 33% below.
    results = [_sized(exact(f"p{i}"), 100, verify=3, role="candidate") for i in range(4)]
    verdict = judge(results, 4, _gate(max_accept_length_drop=0.2)).verdict
    assert [r.rule for r in verdict.failing] == ["accept_length"], verdict.reasons
    (reason,) = verdict.failing
    assert "1.333 vs baseline 2.000" in reason.message and "33.3% below" in reason.message
    loose = judge(results, 4, _gate(max_accept_length_drop=0.5)).verdict
    assert loose.status == "pass"
    # Not measured anywhere (no speculative decoding): nothing to judge, and said so.
    plain = judge([_sized(exact(f"p{i}"), 100) for i in range(4)], 4, _gate()).verdict
    (reason,) = [r for r in plain.reasons if r.rule == "accept_length"]
    assert reason.outcome == "pass" and "not measured" in reason.message


def test_accept_length_is_judged_against_the_baseline_never_the_floor() -> None:
    """A floor drafting EAGLE's chain under a DDTree baseline accepts more per step (4 tokens in
    1 step here) by design: the candidate, matching the baseline's 2.0, passes."""
    plain = [exact(f"p{i}") for i in range(4)]
    with_floor = [
        dataclasses.replace(r, outcomes={**r.outcomes, "floor": r.outcomes["aa"]}) for r in plain
    ]
    results = [_sized(r, 100, verify=1, role="floor") for r in with_floor]
    assert all(r.outcomes["floor"].generation.accept_length == 4.0 for r in results)
    verdict = judge(results, 4, _gate(max_accept_length_drop=0.1)).verdict
    (reason,) = [r for r in verdict.reasons if r.rule == "accept_length"]
    assert reason.outcome == "pass" and "2.000 vs baseline 2.000" in reason.message, reason
    # The report's bucket table beside it compares the same two targets.
    judgement = judge(results, 4, _gate(max_accept_length_drop=0.1))
    table = context_markdown(context_model(judgement, _gate()))
    (row,) = [line for line in table if line.startswith("| short |")]
    assert "| 2.00 / 2.00 |" in row, row


def test_a_candidate_that_stops_reporting_accept_length_fails() -> None:
    base = ok(dataclasses.replace(generation([1, 2]), completion_tokens=2, spec_verify_ct=1))
    cand = ok(generation([1, 2]))
    results = [result(f"p{i}", base, cand) for i in range(4)]
    verdict = judge(results, 4, _gate()).verdict
    assert [r.rule for r in verdict.failing] == ["accept_length"]


# ---------------------------------------------------------------- tokens and progress


def test_tokens_come_from_the_environment_or_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "candidate.token"
    secret.write_text("s3cret-file\n")
    settings = ParitySettings(
        baseline_token="s3cret-env", candidate_token_file=str(secret), floor_token=" "
    )
    assert target_tokens(settings) == {"baseline": "s3cret-env", "candidate": "s3cret-file"}
    assert "s3cret" not in repr(settings)
    problems = [
        ParitySettings(baseline_token="a", baseline_token_file=str(secret)),
        ParitySettings(replica_token_file=str(tmp_path / "missing")),
        ParitySettings(floor_token_file=str(tmp_path)),
    ]
    empty = tmp_path / "empty"
    empty.write_text("\n")
    problems.append(ParitySettings(candidate_token_file=str(empty)))
    messages = []
    for settings in problems:
        with pytest.raises(SettingsError) as info:
            target_tokens(settings)
        messages.append(str(info.value))
    assert "KDTREE_PARITY_BASELINE_TOKEN and KDTREE_PARITY_BASELINE_TOKEN_FILE" in messages[0]
    assert "KDTREE_PARITY_REPLICA_TOKEN_FILE" in messages[1] and "cannot be read" in messages[1]
    assert "KDTREE_PARITY_FLOOR_TOKEN_FILE" in messages[2]
    assert "is empty" in messages[3]
    assert not any("s3cret" in m for m in messages)


def test_progress_lines_come_every_n_prompts_and_every_t_seconds() -> None:
    now = [0.0]
    lines: list[str] = []
    progress = ProgressLines(lines.append, every=3, seconds=10, clock=lambda: now[0])
    progress.tick()  # nothing replayed yet: nothing to say
    for done in range(1, 8):
        now[0] += 1
        progress.update(done, 20, {"hard": 0, "errors": done // 4})
    assert lines == [
        "replay: 1/20 prompts, hard 0, errors 0, 1s",
        "replay: 4/20 prompts, hard 0, errors 1, 4s",
        "replay: 7/20 prompts, hard 0, errors 1, 7s",
    ]
    now[0] += 9.5
    progress.tick()
    assert len(lines) == 3
    now[0] += 1  # 10.5 s after the last line, no prompt done: the ticker says so
    progress.tick()
    assert lines[-1] == "replay: 7/20 prompts, hard 0, errors 1, 18s"
    progress.update(20, 20, {"hard": 0, "errors": 1})
    assert lines[-1].startswith("replay: 20/20 prompts")
