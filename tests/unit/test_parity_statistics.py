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


def _timed(g: Generation, tps: float, reported: float | None = None) -> Outcome:
    """``g`` as the sidecar received it at ``tps`` tokens/s by its own clock, the target
    reporting ``reported`` tokens/s about itself (default: the truth)."""
    timed = replace(g, timing=Timing(1.0, 0.1, tps if reported is None else reported, "x"))
    return Outcome(timed, None, 1, len(g.output_ids) / tps)


def _prompt(
    pid: str, base: Outcome, cand: Outcome, floor: Outcome, aa: Outcome | None = None
) -> PromptResult:
    outcomes = {"baseline": base, "candidate": cand, "aa": aa or base, "floor": floor}
    b = base.generation
    return PromptResult(
        entry=CorpusEntry(id=pid, text=pid, tags=(), line=1),
        outcomes=outcomes,
        candidate=compare_generations(b, cand.generation, 0.05),
        aa=compare_generations(b, outcomes["aa"].generation, 0.05),
        floor=compare_generations(b, floor.generation, 0.05),
    )


def _run(
    cand_scale: float,
    floor_scale: float,
    n: int = 30,
    cand_tps: float = 100.0,
    reported: float | None = None,
    aa_tps: float = 100.0,
    spike: tuple[int, float] | None = None,
):
    """``n`` prompts of 8 positions; ``spike=(every, nats)``: the candidate also drifts by
    ``nats`` at one position of every ``every``-th prompt (a fault at a minority of positions)."""
    rng = random.Random(0)
    base = generation(IDS, -0.5)
    results = []
    for i in range(n):
        cand = _noisy(base, rng, cand_scale)
        if spike is not None and i % spike[0] == 0:
            lps = list(cand.token_logprobs)
            lps[3] -= spike[1]
            cand = replace(cand, token_logprobs=tuple(lps))
        results.append(
            _prompt(
                f"p{i}",
                _timed(base, 100.0 + rng.uniform(-2, 2)),
                _timed(cand, cand_tps + rng.uniform(-2, 2), reported),
                _timed(_noisy(base, rng, floor_scale), 100.0 + rng.uniform(-2, 2)),
                aa=_timed(base, aa_tps + rng.uniform(-2, 2)),
            )
        )
    return summarize(results, n)


def _reason(verdict, rule: str):
    return next(r for r in verdict.reasons if r.rule == rule)


DRIFT_RULES = ("logprob_drift_p99", "logprob_drift_tail", "logprob_drift_prompt_max")


def test_candidate_at_the_floors_noise_passes_against_an_aa_prime_floor() -> None:
    # Drift of the same size as the A/A' floor's: the old bare-threshold gate against the exact
    # twin (zero noise) would fail this candidate (p99 ~3e-4 > 1e-4).
    summary = _run(cand_scale=3e-4, floor_scale=3e-4)
    assert summary.floor is not None and summary.noise is summary.floor
    assert summary.aa.drift.max == 0.0 and summary.candidate.drift.p99 > GATE.max_logprob_drift_p99
    verdict = decide(summary, GATE)
    assert verdict.status == "pass", [r.message for r in verdict.failing]
    drift = _reason(verdict, "logprob_drift_p99")
    assert drift.test is not None and drift.test.name == "logprob_drift"
    low, high = drift.test.interval
    assert low <= drift.test.estimate <= high <= GATE.max_logprob_drift_p99
    assert drift.test.alpha == pytest.approx(0.05 / 5) and drift.test.power
    tests = {_reason(verdict, rule).test.name: _reason(verdict, rule).test for rule in DRIFT_RULES}
    assert set(tests) == {"logprob_drift", "drift_exceedances", "drift_prompt_maxima"}
    assert all(t.decision == "pass" and "power" in t.power for t in list(tests.values())[1:])
    # Without the floor the same candidate fails: the exact twin proves only determinism.
    no_floor = replace(summary, floor=None)
    assert _reason(decide(no_floor, GATE), "logprob_drift_p99").outcome == "fail"


def test_candidate_drifting_beyond_the_floor_fails_with_its_interval() -> None:
    summary = _run(cand_scale=3e-3, floor_scale=3e-4)
    verdict = decide(summary, GATE)
    drift = _reason(verdict, "logprob_drift_p99")
    assert verdict.status == "fail" and drift.outcome == "fail"
    assert drift.test.interval[0] > GATE.max_logprob_drift_p99
    assert "beyond the margin" in drift.message and "A/A'" in drift.message


def test_harmless_drift_inside_the_margin_passes() -> None:
    # 2e-5 vs 1e-5 over 240 positions each: a real difference, far inside the 1e-4 margin.
    verdict = decide(_run(cand_scale=2e-5, floor_scale=1e-5), GATE)
    assert [r.outcome for r in map(lambda n: _reason(verdict, n), DRIFT_RULES)] == ["pass"] * 3


def test_a_fault_at_a_minority_of_positions_fails_against_a_noisy_floor() -> None:
    """One position in every fourth prompt drifts by 0.05 nats (a dropped KV row, a mask error
    past some length); every other position is at the floor's noise. Before: a Mann-Whitney
    test over all positions was not significant, and the candidate PASSED with a p99 excess
    hundreds of times the margin."""
    summary = _run(cand_scale=3e-4, floor_scale=3e-4, spike=(4, 0.05))
    verdict = decide(summary, GATE)
    assert verdict.status == "fail"
    tail = _reason(verdict, "logprob_drift_tail")
    maxima = _reason(verdict, "logprob_drift_prompt_max")
    assert tail.outcome == "fail" and tail.test.p_value < tail.test.alpha, tail.message
    assert tail.test.statistic == 8  # 8 of 240 positions above the floor's p99 + margin
    assert maxima.outcome == "fail" and maxima.test.statistic == 8, maxima.message


def test_a_few_positions_far_off_never_pass() -> None:
    """5 nats off at one position of 2 of 40 prompts (0.6% of the positions): below the p99,
    so the old rule never judged it, and the run PASSED."""
    summary = _run(cand_scale=0.0, floor_scale=0.0, n=40, spike=(20, 5.0))
    verdict = decide(summary, GATE)
    assert summary.candidate.drift.p99 == 0.0 and summary.candidate.drift.max == 5.0
    assert verdict.status != "pass"
    assert _reason(verdict, "logprob_drift_p99").outcome != "pass"


def _diverging(pid: str, diverges: bool) -> PromptResult:
    base = generation([1, 2, 3, 5], alt=4)
    other = generation([1, 2, 4, 5], alt=3)  # a near-tie at position 2
    return _prompt(pid, ok(base), ok(other if diverges else base), ok(base))


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


def test_divergence_rate_must_be_shown_within_the_margin() -> None:
    # 5 near-tie divergences in 40 vs the floor's 2: an excess of 0.075 that the corpus can show
    # neither within nor beyond 0.05. Before: Fisher p ~0.22 was "not significant", a PASS.
    results = _with_floor_divergences(cand=5, floor=2)
    verdict = decide(summarize(results, 40), GATE)
    rule = _reason(verdict, "excess_divergence_rate")
    assert rule.outcome == "undecided" and verdict.status == "error", rule.message
    assert rule.test.name == "divergence_count" and 0.1 < rule.test.p_value < 0.5
    low, high = rule.test.interval
    assert low <= GATE.max_excess_divergence_rate < high
    # 20 of 40 vs 2 of 40 is shown beyond the margin.
    many = decide(summarize(_with_floor_divergences(cand=20, floor=2), 40), GATE)
    rule = _reason(many, "excess_divergence_rate")
    assert rule.outcome == "fail" and rule.test.interval[0] > 0.05
    # As many as the floor, on the same prompts: shown within.
    same = decide(summarize(_with_floor_divergences(cand=0, floor=0), 40), GATE)
    assert _reason(same, "excess_divergence_rate").outcome == "pass"


def test_a_slower_candidate_is_refused_by_the_sidecars_clock() -> None:
    summary = _run(cand_scale=3e-4, floor_scale=3e-4, cand_tps=60.0)
    speed = _reason(decide(summary, GATE), "speed")
    assert speed.outcome == "fail", speed.message
    low, high = speed.test.interval
    assert low <= speed.test.estimate <= high < 0.9
    assert speed.test.estimate == pytest.approx(0.6, abs=0.03)
    # 5% slower is inside max_slowdown 0.1: passes.
    close = _reason(decide(_run(3e-4, 3e-4, cand_tps=97.0), GATE), "speed")
    assert close.outcome == "pass", close.message
    # No speed rule at all when the policy says so.
    off = _reason(decide(summary, GATE.model_copy(update={"max_slowdown": None})), "speed")
    assert off.outcome == "pass" and "no speed rule" in off.message


def test_what_a_candidate_reports_about_its_speed_never_decides() -> None:
    """Before: the target's own decode_throughput was used, so a candidate 4x slower that
    reported 2000 tokens/s PASSED, and an equally fast one without timing fields FAILED."""
    boasting = _reason(decide(_run(3e-4, 3e-4, cand_tps=25.0, reported=2000.0), GATE), "speed")
    assert boasting.outcome == "fail" and "2000 vs" in boasting.message, boasting.message
    assert "not used" in boasting.message
    base = generation(IDS)
    silent = [
        PromptResult(
            entry=CorpusEntry(id=f"p{i}", text="x", tags=(), line=1),
            outcomes={
                "baseline": _timed(base, 100.0 + i % 3),
                "candidate": Outcome(base, None, 1, len(IDS) / (100.0 + i % 2)),  # no timing
                "aa": _timed(base, 100.0 + i % 2),
            },
            candidate=compare_generations(base, base, 0.05),
            aa=compare_generations(base, base, 0.05),
        )
        for i in range(12)
    ]
    assert _reason(decide(summarize(silent, 12), GATE), "speed").outcome == "pass"


def test_a_slow_twin_is_no_licence_for_a_slow_candidate() -> None:
    """Before: the bound was scaled by the A/A ratio, so a twin as slow as the candidate let a
    candidate 40% slower PASS."""
    speed = _reason(decide(_run(3e-4, 3e-4, cand_tps=60.0, aa_tps=60.0), GATE), "speed")
    assert speed.outcome == "fail", speed.message
    noisy = _reason(decide(_run(3e-4, 3e-4, cand_tps=99.0, aa_tps=60.0), GATE), "speed")
    assert noisy.outcome == "undecided" and "too large" in noisy.test.power


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


def test_the_stated_power_is_the_binomial_tests_own() -> None:
    from scipy import stats

    from kdtree_parity.noninferiority import smallest_detectable_rate

    # Against a share of 0 any unit above the threshold fails: 80% power to see one of n.
    assert smallest_detectable_rate(5, 0.0, 0.01) == pytest.approx(1 - 0.2 ** (1 / 5))
    share = smallest_detectable_rate(240, 0.01, 0.01)
    k = next(k for k in range(241) if stats.binom.sf(k - 1, 240, 0.01) < 0.01)
    assert stats.binom.sf(k - 1, 240, share) == pytest.approx(0.8, abs=1e-6)
    assert smallest_detectable_rate(3, 0.25, 0.01) == 1.0  # 3 units can never reject
