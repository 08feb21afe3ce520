"""The reference targets (the A/A twin, the A/A' floor) checked before they are trusted: distinct
URLs, distinct processes serving the baseline's model, agreement with the baseline."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from parity_factories import generation, ok

from kdtree_parity.compare import compare_generations
from kdtree_parity.corpus import CorpusEntry
from kdtree_parity.gate import decide, summarize
from kdtree_parity.policy import GateSettings
from kdtree_parity.reference_targets import (
    distinct_url_problems,
    identity_problems,
    normalized_url,
)
from kdtree_parity.results import PromptResult

GATE = GateSettings(min_prompts=4, max_excess_divergence_rate=0.5, max_floor_drift_p99=0.01)


def test_one_endpoint_has_one_spelling() -> None:
    same = {
        "http://127.0.0.1:30000",
        "http://localhost:30000/",
        "HTTP://LOCALHOST:30000",
    }
    assert {normalized_url(u) for u in same} == {"http://127.0.0.1:30000"}
    assert normalized_url("http://host") == normalized_url("http://host:80")
    assert normalized_url("http://a:1") != normalized_url("http://a:2")


def test_the_candidate_floor_and_replica_must_be_other_targets() -> None:
    """Before: each of these was accepted, and in each a faulty candidate PASSED."""
    assert distinct_url_problems({"--baseline": "http://a:1", "--candidate": "http://a:2"}) == []
    # No replica: the twin is the baseline replayed (the service's pairs name it "aa").
    assert distinct_url_problems({"p baseline": "http://a:1", "p candidate": "http://a:2",
                                  "p aa": "http://a:1"}) == []  # fmt: skip
    cases = {
        ("--baseline", "--candidate"): "compare the baseline with itself",
        ("--candidate", "--floor"): "the floor would be the candidate itself",
        ("--baseline", "--floor"): "the floor would measure no noise",
        ("--candidate", "--replica"): "the A/A twin would be the candidate itself",
    }
    for (first, second), why in cases.items():
        urls = {"--baseline": "http://a:1", "--candidate": "http://a:2", "--floor": "http://a:3"}
        urls[second] = urls[first].replace("a:", "A:") + "/"
        (problem,) = distinct_url_problems(urls)
        assert why in problem, problem


def test_the_cli_refuses_a_candidate_that_is_the_baseline(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kdtree_parity.cli", "run",
        "--baseline",
        "http://127.0.0.1:9",
        "--candidate",
        "http://localhost:9/",
        "--corpus",
        "short",
        "--policy",
        "short",
        "--db",
        str(tmp_path / "runs.sqlite3"),
        "--out",
        str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "compare the baseline with itself" in done.stderr, done.stderr


def _info(server: str, model: str = "m", digest: str | None = "d") -> dict:
    return {
        "model_path": model,
        "kdtree_engine": {"server_id": server, "weights_sha256": digest},
    }


def test_identities_show_one_process_behind_two_urls_and_a_floor_of_another_model() -> None:
    fine = {"baseline": _info("b"), "candidate": _info("c"), "floor": _info("f")}
    assert identity_problems(fine) == []
    (same,) = identity_problems({**fine, "floor": _info("c")})
    assert "the floor and the candidate are one server process" in same
    (disguised,) = identity_problems({**fine, "candidate": _info("b")})
    assert "the candidate and the baseline are one server process" in disguised
    (twin,) = identity_problems({**fine, "aa": _info("c")})
    assert "the aa and the candidate are one server process" in twin
    problems = identity_problems({**fine, "floor": _info("f", model="other", digest="x")})
    assert len(problems) == 2 and "not the baseline's model" in problems[0]
    # SGLang reports no process identity and no digest: only the model is compared.
    plain = {role: {"model_path": "m"} for role in ("baseline", "candidate", "floor")}
    assert identity_problems(plain) == []


def _with_floor(floor_of, n: int = 6) -> list[PromptResult]:
    """``n`` prompts where the candidate and the twin match the baseline, the floor answering
    ``floor_of(baseline's generation)``."""
    base = generation([1, 2, 3, 4], -0.5)
    floor = floor_of(base)
    return [
        PromptResult(
            entry=CorpusEntry(id=f"p{i}", text="x", tags=(), line=1),
            outcomes={
                "baseline": ok(base),
                "candidate": ok(base),
                "aa": ok(base),
                "floor": ok(floor),
            },
            candidate=compare_generations(base, base, 0.05),
            aa=compare_generations(base, base, 0.05),
            floor=compare_generations(base, floor, 0.05),
        )
        for i in range(n)
    ]


def _reason(verdict, rule: str):
    return next(r for r in verdict.reasons if r.rule == rule)


def test_a_floor_that_disagrees_with_the_baseline_leaves_the_run_undecided() -> None:
    """Before: a floor with 40 of 40 hard divergences raised the bar, and a candidate with 5
    hard divergences PASSED although any hard divergence fails."""

    def broken(b):
        return replace(b, output_ids=(b.output_ids[0], 99, *b.output_ids[2:]))

    verdict = decide(summarize(_with_floor(broken), 6), GATE)
    rule = _reason(verdict, "reference_targets")
    assert verdict.status == "error" and rule.outcome == "undecided"
    assert "diverged hard from the baseline on 6 prompt(s)" in rule.message

    def drifting(b):
        return replace(b, token_logprobs=tuple(lp - 0.05 for lp in b.token_logprobs))

    rule = _reason(decide(summarize(_with_floor(drifting), 6), GATE), "reference_targets")
    assert rule.outcome == "undecided" and "exceeds the ceiling" in rule.message
    rule = _reason(decide(summarize(_with_floor(lambda b: b), 6), GATE), "reference_targets")
    assert rule.outcome == "pass", rule.message
    refused = decide(summarize(_with_floor(lambda b: b), 6), GATE, reference_problems=["x"])
    assert _reason(refused, "reference_targets").outcome == "undecided"
