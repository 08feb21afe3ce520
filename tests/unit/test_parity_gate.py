"""Aggregation and the verdict: every rule, judged against A/A noise."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from parity_factories import exact, failed, generation, hard, near_tie, ok, result

from kdtree_parity.gate import decide, summarize
from kdtree_parity.policy import GateSettings

GATE = GateSettings(
    min_prompts=4,
    max_hard_divergences=0,
    min_exact_match_rate=0.5,
    max_excess_divergence_rate=0.5,
    max_logprob_drift_p99=0.1,
)


def outcome_of(verdict, rule: str) -> str:
    return next(r.outcome for r in verdict.reasons if r.rule == rule)


def test_all_exact_passes_with_every_rule_listed() -> None:
    results = [exact(f"p{i}") for i in range(5)]
    verdict = decide(summarize(results, 5), GATE)
    assert verdict.status == "pass"
    assert {r.rule for r in verdict.reasons} == {
        "complete",
        "baseline_errors",
        "undecidable_prompts",
        "candidate_reachable",
        "candidate_errors",
        "min_prompts",
        "aa_exact",
        "reference_targets",
        "hard_divergences",
        "exact_match_rate",
        "excess_divergence_rate",
        "finish_reasons",
        "logprob_drift_p99",
        "logprob_drift_tail",
        "logprob_drift_prompt_max",
        "speed",
    }
    assert all(r.outcome == "pass" for r in verdict.reasons)


def test_one_hard_divergence_fails_and_names_the_prompt() -> None:
    results = [exact("p0"), exact("p1"), exact("p2"), hard("bad-7")]
    summary = summarize(results, 4)
    assert summary.candidate.hard == 1 and summary.candidate.hard_prompt_ids == ("bad-7",)
    assert summary.candidate.divergence_positions == (2,)
    verdict = decide(summary, GATE)
    # A hard divergence fails, although 4 prompts cannot show the divergence rate within its
    # margin (undecided): a rule shown failed outranks a rule short of evidence.
    assert verdict.status == "fail"
    failing = {r.rule: r.message for r in verdict.failing if r.outcome == "fail"}
    assert set(failing) == {"hard_divergences"}
    assert "bad-7" in failing["hard_divergences"]
    assert outcome_of(verdict, "excess_divergence_rate") == "undecided"


def test_near_ties_are_tolerated_within_rate_thresholds() -> None:
    results = [exact(f"p{i}") for i in range(19)] + [near_tie("tie")]
    summary = summarize(results, 20)
    assert summary.candidate.near_tie == 1 and summary.candidate.hard == 0
    assert decide(summary, GATE).status == "pass"
    # One near-tie in four prompts: too few to show the rate within the margin.
    few = summarize(results[-4:], 4)
    assert decide(few, GATE).status == "error"
    strict = GATE.model_copy(update={"min_exact_match_rate": 0.99})
    verdict = decide(summary, strict)
    assert verdict.status == "fail"
    assert outcome_of(verdict, "exact_match_rate") == "fail"


def test_candidate_is_judged_by_excess_over_aa_noise() -> None:
    # Baseline and its twin disagree on one prompt (noise); the candidate differs on the same one.
    base = ok(generation([1, 2, 3, 5], alt=4))
    twin = ok(generation([1, 2, 4, 5], alt=3))
    noisy = [result("noisy", base, twin, aa=twin)] + [exact(f"p{i}") for i in range(4)]
    summary = summarize(noisy, 5)
    assert summary.aa.diverged == 1 and summary.candidate.diverged == 1
    assert summary.excess_divergence_rate == pytest.approx(0.0)
    # By default a non-deterministic baseline makes the run undecidable, not a pass.
    verdict = decide(summary, GATE)
    assert verdict.status == "error" and outcome_of(verdict, "aa_exact") == "undecided"
    allowed = GATE.model_copy(update={"allow_aa_divergence": True, "max_excess_divergence_rate": 0})
    assert decide(summary, allowed).status == "pass"


def test_hard_divergences_count_in_excess_of_aa() -> None:
    base = ok(generation([1, 2, 3, 4]))
    other = ok(generation([1, 2, 9, 9]))
    results = [result("h", base, other, aa=other)] + [exact(f"p{i}") for i in range(4)]
    summary = summarize(results, 5)
    assert summary.candidate.hard == 1 and summary.aa.hard == 1 and summary.excess_hard == 0
    allowed = GATE.model_copy(update={"allow_aa_divergence": True})
    assert outcome_of(decide(summary, allowed), "hard_divergences") == "pass"


def test_logprob_drift_beyond_aa_fails() -> None:
    drifted = result("d", ok(generation([1, 2, 3], -0.1)), ok(generation([1, 2, 3], -0.4)))
    results = [drifted] + [exact(f"p{i}") for i in range(4)]
    summary = summarize(results, 5)
    assert summary.candidate.exact == 5
    assert summary.candidate.drift.max == pytest.approx(0.3)
    verdict = decide(summary, GATE)
    assert verdict.status == "fail"
    # 3 of 15 positions above the margin: shown beyond it; 5 prompts cannot show the p99 excess
    # within or beyond (undecided), nor does one prompt of five stand out among the maxima.
    assert {r.rule: r.outcome for r in verdict.failing} == {
        "logprob_drift_p99": "undecided",
        "logprob_drift_tail": "fail",
    }


def test_incomplete_run_is_an_error_never_a_pass() -> None:
    results = [exact(f"p{i}") for i in range(5)]
    assert decide(summarize(results, 6), GATE).status == "error"
    verdict = decide(summarize(results, 5), GATE, aborted_because="candidate died")
    assert verdict.status == "error"
    assert "candidate died" in next(r.message for r in verdict.reasons if r.rule == "complete")


def test_transport_errors_are_undecided_and_refusals_fail() -> None:
    g = ok(generation([1, 2]))
    base_down = [result("x", failed("connect"), g)] + [exact(f"p{i}") for i in range(4)]
    verdict = decide(summarize(base_down, 5), GATE)
    assert verdict.status == "error" and outcome_of(verdict, "baseline_errors") == "undecided"

    cand_down = [result("x", g, failed("timeout"))] + [exact(f"p{i}") for i in range(4)]
    verdict = decide(summarize(cand_down, 5), GATE)
    assert verdict.status == "error" and outcome_of(verdict, "candidate_reachable") == "undecided"

    refused = [result("x", g, failed("http", 500))] + [exact(f"p{i}") for i in range(4)]
    summary = summarize(refused, 5)
    assert summary.errors["candidate"] == {"http": 1} and summary.prompts_compared == 4
    verdict = decide(summary, GATE)
    assert verdict.status == "fail" and outcome_of(verdict, "candidate_errors") == "fail"
    lenient = GATE.model_copy(update={"max_candidate_errors": 1})
    assert decide(summary, lenient).status == "pass"


def test_too_few_compared_prompts_is_undecided() -> None:
    verdict = decide(summarize([exact("p0"), exact("p1")], 2), GATE)
    assert verdict.status == "error" and outcome_of(verdict, "min_prompts") == "undecided"


def test_candidate_errors_fail_even_when_other_rules_are_undecided() -> None:
    """A candidate that answers with errors is broken: too few compared prompts, a run cut
    short or a failing baseline elsewhere do not turn its failure into "could not decide"."""
    g = ok(generation([1, 2]))
    one_500 = [result("x", g, failed("http", 500))] + [exact(f"p{i}") for i in range(4)]
    strict = GATE.model_copy(update={"min_prompts": 5})  # the whole corpus
    verdict = decide(summarize(one_500, 5), strict)
    assert outcome_of(verdict, "min_prompts") == "undecided"
    assert verdict.status == "fail" and outcome_of(verdict, "candidate_errors") == "fail"

    all_404 = [result(f"p{i}", g, failed("http", 404)) for i in range(5)]
    verdict = decide(summarize(all_404, 5), strict, aborted_because="baseline went away")
    assert outcome_of(verdict, "complete") == "undecided"
    assert verdict.status == "fail" and "5 candidate request(s)" in next(
        r.message for r in verdict.reasons if r.rule == "candidate_errors"
    )

    # A refused health check counts as a candidate error with nothing replayed at all.
    verdict = decide(summarize([], 5), GATE, candidate_refused="HTTP 404 on /health")
    assert verdict.status == "fail" and "HTTP 404 on /health" in next(
        r.message for r in verdict.reasons if r.rule == "candidate_errors"
    )


def test_nothing_compared_is_undecided_not_a_rate_of_zero() -> None:
    g = ok(generation([1, 2]))
    base_down = [result(f"p{i}", failed("http", 500), g) for i in range(4)]
    verdict = decide(summarize(base_down, 4), GATE)
    assert verdict.status == "error"
    for rule in ("exact_match_rate", "excess_divergence_rate", "logprob_drift_p99"):
        reason = next(r for r in verdict.reasons if r.rule == rule)
        assert reason.outcome == "undecided" and reason.message == (
            "no prompt was compared on every target"
        )
    assert not any("(0/0)" in r.message for r in verdict.reasons)


def test_an_error_the_baseline_shares_is_undecidable_not_the_candidates_fault() -> None:
    """Before: the candidate's 400 on a prompt the baseline also answered 400 FAILED it."""
    too_long = result("too-long", failed("http", 400), failed("http", 400), aa=failed("http", 400))
    summary = summarize([too_long] + [exact(f"p{i}") for i in range(4)], 5)
    assert summary.undecidable == (
        ("too-long", "baseline: http failure; candidate: http failure; aa: http failure"),
    )
    assert summary.error_count("candidate") == 0 and summary.error_count("baseline") == 0
    verdict = decide(summary, GATE)
    assert verdict.status == "error"
    assert outcome_of(verdict, "candidate_errors") == "pass"
    reason = next(r for r in verdict.reasons if r.rule == "undecidable_prompts")
    assert reason.outcome == "undecided" and "too-long (baseline: http failure" in reason.message
    # The candidate answering that prompt fine does not make it decidable either.
    g = ok(generation([1, 2]))
    alone = result("too-long", failed("http", 400), g, aa=failed("http", 400))
    verdict = decide(summarize([alone] + [exact(f"p{i}") for i in range(4)], 5), GATE)
    assert verdict.status == "error" and outcome_of(verdict, "undecidable_prompts") == "undecided"
    # A baseline that did not answer, failed with a 5xx or was rate limited rejected nothing:
    # the candidate's own 500 on that prompt still counts.
    for baseline in (failed("connect"), failed("http", 500), failed("http", 429)):
        unanswered = result("x", baseline, failed("http", 500))
        verdict = decide(summarize([unanswered] + [exact(f"p{i}") for i in range(4)], 5), GATE)
        assert verdict.status == "fail" and outcome_of(verdict, "candidate_errors") == "fail"
        assert outcome_of(verdict, "undecidable_prompts") == "pass"
        assert outcome_of(verdict, "baseline_errors") == "undecided"


def with_finish(pid: str, candidate_finish: str, twin_finish: str = "length"):
    base = generation([1, 2, 3])
    cand = replace(base, finish_reason=candidate_finish)
    twin = replace(base, finish_reason=twin_finish)
    return result(pid, ok(base), ok(cand), aa=ok(twin))


def test_the_right_tokens_with_another_finish_reason_fail_beyond_aa() -> None:
    """Before: PASS; finish_differs was counted but judged by no rule."""
    results = [with_finish("ab", "abort")] + [exact(f"p{i}") for i in range(4)]
    summary = summarize(results, 5)
    assert summary.candidate.exact == 5 and summary.candidate.finish_mismatch == 1
    verdict = decide(summary, GATE)
    assert verdict.status == "fail" and [r.rule for r in verdict.failing] == ["finish_reasons"]
    assert "ab" in verdict.failing[0].message
    assert decide(summary, GATE.model_copy(update={"max_finish_mismatches": 1})).status == "pass"
    # The same difference between the baseline and its twin is noise, not the candidate's.
    noisy = [with_finish("ab", "abort", twin_finish="abort")] + [exact(f"p{i}") for i in range(4)]
    allowed = GATE.model_copy(update={"allow_aa_divergence": True})
    summary = summarize(noisy, 5)
    assert summary.aa.finish_mismatch == 1 and summary.excess_finish_mismatch == 0
    assert outcome_of(decide(summary, allowed), "finish_reasons") == "pass"


def no_logprobs(pid: str, cand_diverges_at_first: bool = False):
    silent = replace(generation([1, 2, 3]), token_logprobs=(-math.inf,) * 3)
    other = replace(generation([9, 2, 3]), token_logprobs=(-0.1,) * 3)
    if cand_diverges_at_first:
        return result(pid, ok(generation([1, 2, 3])), ok(other))
    return result(pid, ok(silent), ok(silent))


def test_drift_measured_nowhere_is_never_a_pass() -> None:
    """Before: 0 drift samples read as "p99 logprob drift 0" and passed."""
    # The baseline reports no logprobs, so neither pair can measure drift: undecided.
    verdict = decide(summarize([no_logprobs(f"p{i}") for i in range(4)], 4), GATE)
    reason = next(r for r in verdict.reasons if r.rule == "logprob_drift_p99")
    assert reason.outcome == "undecided" and "not measured" in reason.message
    assert verdict.status == "error"
    # The A/A pair measured drift but the candidate agreed on no first token: the candidate's.
    lenient = GATE.model_copy(update={"max_hard_divergences": 10, "min_exact_match_rate": 0})
    lenient = lenient.model_copy(update={"max_excess_divergence_rate": 1})
    results = [no_logprobs(f"p{i}", cand_diverges_at_first=True) for i in range(4)]
    verdict = decide(summarize(results, 4), lenient)
    assert outcome_of(verdict, "logprob_drift_p99") == "fail" and verdict.status == "fail"
