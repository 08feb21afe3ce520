"""The gate's statistical rules against an A/A' noise floor, and the speed rule (real data
classes, real scipy). Each test states what it would have passed or failed without the rule."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from parity_factories import generation, ok

from kdtree_parity.compare import compare_generations
from kdtree_parity.corpus import CorpusEntry
from kdtree_parity.gate import decide, summarize
from kdtree_parity.generation import Generation, Timing, parse_timing
from kdtree_parity.policy import GateSettings, PolicyError, parse_policy
from kdtree_parity.results import Outcome, PromptResult

GATE = GateSettings(
    min_prompts=10,
    max_hard_divergences=0,
    min_exact_match_rate=0.5,
    max_excess_divergence_rate=0.05,
    max_logprob_drift_p99=1e-4,
    alpha=0.05,
    max_slowdown=0.1,
)
IDS = [1, 2, 3, 4, 5, 6, 7, 8]


def _noisy(g: Generation, rng: random.Random, scale: float) -> Generation:
    """``g`` with every chosen-token logprob moved by up to ``scale`` nats (same tokens)."""
    return replace(g, token_logprobs=tuple(lp - rng.uniform(0, scale) for lp in g.token_logprobs))


def _timed(g: Generation, decode_tps: float) -> Generation:
    return replace(g, timing=Timing(1.0, 0.1, decode_tps, "decode_throughput"))


def _prompt(pid: str, base: Generation, cand: Generation, floor: Generation) -> PromptResult:
    outcomes = {"baseline": ok(base), "candidate": ok(cand), "aa": ok(base), "floor": ok(floor)}
    return PromptResult(
        entry=CorpusEntry(id=pid, text=pid, tags=(), line=1),
        outcomes=outcomes,
        candidate=compare_generations(base, cand, 0.05),
        aa=compare_generations(base, base, 0.05),
        floor=compare_generations(base, floor, 0.05),
    )


def _run(cand_scale: float, floor_scale: float, n: int = 30, cand_tps: float = 100.0):
    rng = random.Random(0)
    base = generation(IDS, -0.5)
    results = [
        _prompt(
            f"p{i}",
            _timed(base, 100.0 + rng.uniform(-2, 2)),
            _timed(_noisy(base, rng, cand_scale), cand_tps + rng.uniform(-2, 2)),
            _timed(_noisy(base, rng, floor_scale), 100.0 + rng.uniform(-2, 2)),
        )
        for i in range(n)
    ]
    return summarize(results, n)


def _reason(verdict, rule: str):
    return next(r for r in verdict.reasons if r.rule == rule)


def test_candidate_at_the_floors_noise_passes_against_an_aa_prime_floor() -> None:
    # Drift of the same size as the A/A' floor's: the old bare-threshold gate against the exact
    # twin (zero noise) would fail this candidate (p99 ~3e-4 > 1e-4).
    summary = _run(cand_scale=3e-4, floor_scale=3e-4)
    assert summary.floor is not None and summary.noise is summary.floor
    assert summary.aa.drift.max == 0.0 and summary.candidate.drift.p99 > GATE.max_logprob_drift_p99
    verdict = decide(summary, GATE)
    drift = _reason(verdict, "logprob_drift_p99")
    assert drift.outcome == "pass", drift.message
    assert drift.test is not None and drift.test.name == "logprob_drift"
    assert drift.test.p_value is not None and drift.test.p_value > drift.test.alpha
    assert drift.test.alpha == pytest.approx(0.05 / 3)
    assert "Mann-Whitney" in drift.test.method and drift.test.decision == "pass"
    assert verdict.status == "pass", [r.message for r in verdict.failing]
    # Without the floor the same candidate fails: the exact twin proves only determinism.
    no_floor = replace(summary, floor=None)
    assert _reason(decide(no_floor, GATE), "logprob_drift_p99").outcome == "fail"


def test_candidate_drifting_beyond_the_floor_fails_with_its_statistic() -> None:
    summary = _run(cand_scale=3e-3, floor_scale=3e-4)
    verdict = decide(summary, GATE)
    drift = _reason(verdict, "logprob_drift_p99")
    assert verdict.status == "fail" and drift.outcome == "fail"
    assert drift.test is not None and drift.test.decision == "fail"
    assert drift.test.p_value < 1e-6 and drift.test.statistic > 0
    assert "significant" in drift.message and "A/A'" in drift.message


def test_significant_but_harmless_drift_passes_inside_the_margin() -> None:
    # 2e-5 vs 1e-5 over 240 positions each is significant, and far inside the 1e-4 margin.
    summary = _run(cand_scale=2e-5, floor_scale=1e-5)
    drift = _reason(decide(summary, GATE), "logprob_drift_p99")
    assert drift.test.p_value < drift.test.alpha
    assert drift.outcome == "pass"


def _diverging(pid: str, diverges: bool) -> PromptResult:
    base = generation([1, 2, 3, 5], alt=4)
    other = generation([1, 2, 4, 5], alt=3)  # a near-tie at position 2
    return _prompt(pid, base, other if diverges else base, base)


def _with_floor_divergences(cand: int, floor: int, n: int = 40) -> list[PromptResult]:
    results = []
    for i in range(n):
        r = _diverging(f"p{i}", i < cand)
        floor_gen = generation([1, 2, 4, 5], alt=3) if i >= n - floor else None
        if floor_gen is not None:
            base = r.outcomes["baseline"].generation
            r = replace(
                r,
                outcomes={**r.outcomes, "floor": ok(floor_gen)},
                floor=compare_generations(base, floor_gen, 0.05),
            )
        results.append(r)
    return results


def test_divergence_count_is_judged_by_fisher_against_the_floor() -> None:
    # 5 near-tie divergences in 40 vs the floor's 2: an excess rate of 0.075 > 0.05, which a
    # bare threshold fails, and not significant (Fisher p ~0.22).
    results = _with_floor_divergences(cand=5, floor=2)
    verdict = decide(summarize(results, 40), GATE)
    rule = _reason(verdict, "excess_divergence_rate")
    assert rule.outcome == "pass", rule.message
    assert rule.test.name == "divergence_count" and 0.1 < rule.test.p_value < 0.5
    # 20 of 40 vs 2 of 40 is significant and beyond the margin.
    many = decide(summarize(_with_floor_divergences(cand=20, floor=2), 40), GATE)
    rule = _reason(many, "excess_divergence_rate")
    assert rule.outcome == "fail" and rule.test.p_value < 1e-4 and rule.test.decision == "fail"


def test_a_slower_candidate_is_refused_with_its_interval() -> None:
    summary = _run(cand_scale=3e-4, floor_scale=3e-4, cand_tps=60.0)
    speed = _reason(decide(summary, GATE), "speed")
    assert speed.outcome == "fail", speed.message
    low, high = speed.test.interval
    assert low <= speed.test.estimate <= high < 0.9
    assert speed.test.estimate == pytest.approx(0.6, abs=0.03)
    # 5% slower is inside max_slowdown 0.1: passes.
    close = _reason(decide(_run(3e-4, 3e-4, cand_tps=95.0), GATE), "speed")
    assert close.outcome == "pass", close.message
    # No speed rule at all when the policy says so.
    off = _reason(decide(summary, GATE.model_copy(update={"max_slowdown": None})), "speed")
    assert off.outcome == "pass" and "no speed rule" in off.message


def test_speed_without_timings_falls_back_to_elapsed_time() -> None:
    base = generation(IDS)
    results = [
        PromptResult(
            entry=CorpusEntry(id=f"p{i}", text="x", tags=(), line=1),
            outcomes={
                "baseline": Outcome(base, None, 1, 0.1),
                "candidate": Outcome(base, None, 1, 0.4),  # 4x slower, no meta_info timings
                "aa": Outcome(base, None, 1, 0.1 + i * 1e-3),
            },
            candidate=compare_generations(base, base, 0.05),
            aa=compare_generations(base, base, 0.05),
        )
        for i in range(12)
    ]
    summary = summarize(results, 12)
    assert summary.speed.median_decode("baseline") == pytest.approx(80.0)
    assert _reason(decide(summary, GATE), "speed").outcome == "fail"


def test_timing_is_read_as_sglang_sends_it() -> None:
    assert parse_timing(
        {"e2e_latency": 2.0, "first_token_latency": 0.5, "decode_throughput": 40.0}, 31
    ) == Timing(2.0, 0.5, 40.0, "decode_throughput")
    derived = parse_timing({"e2e_latency": 2.0, "first_token_latency": 0.5}, 31)
    assert derived.decode_tps == pytest.approx(20.0) and derived.decode_source == "latencies"
    plain = parse_timing({"e2e_latency": 2.0}, 30)  # SGLang without --enable-metrics
    assert plain.decode_tps == pytest.approx(15.0) and plain.ttft_s is None
    assert parse_timing({"e2e_latency": "soon"}, 3) is None
    assert parse_timing({}, 3) is None


def test_policy_alpha_and_max_slowdown_load_strictly_and_default() -> None:
    old = parse_policy("gate:\n  min_prompts: 5\n").policy.gate  # a policy from before them
    assert old.alpha == 0.05 and old.max_slowdown == 0.1
    assert parse_policy("gate:\n  max_slowdown: null\n").policy.gate.max_slowdown is None
    for bad in ("alpha: 0", "alpha: 1.5", "alpha: '0.05'", "max_slowdown: 1", "max_slowdown: -0.1"):
        with pytest.raises(PolicyError, match=r"<policy>:2: gate\.(alpha|max_slowdown)"):
            parse_policy(f"gate:\n  {bad}\n")
    with pytest.raises(PolicyError, match=r"duplicate key 'alpha' \(first on line 2\)"):
        parse_policy("gate:\n  alpha: 0.05\n  alpha: 0.01\n")


def test_a_one_prompt_run_is_judged_on_its_point_estimate() -> None:
    """A single prompt has no spread to resample: the speed rule decides on the ratio itself
    rather than leaving every one-prompt run undecided."""
    one = _run(3e-4, 3e-4, n=1)
    speed = _reason(decide(one, GATE.model_copy(update={"min_prompts": 1})), "speed")
    assert speed.outcome == "pass" and speed.test.interval[0] == speed.test.interval[1]
    slow = _reason(decide(_run(3e-4, 3e-4, n=1, cand_tps=30.0), GATE), "speed")
    assert slow.outcome == "fail"
