"""Aggregate per-prompt results and decide: pass, fail, or error (could not decide).

Every rule is evaluated and reported, passing or not, so a verdict always carries all its
reasons. A rule's failure is either ``fail`` (the candidate is worse than the policy allows) or
``undecided`` (the run cannot support a decision: incomplete, a baseline or transport error, a
prompt the baseline rejected too, too few prompts, a non-deterministic baseline, drift that could
not be measured on the baseline). Precedence, first match wins:

1. the candidate answered with errors (an HTTP error, a malformed body, a refused health check)
   beyond ``max_candidate_errors``: ``fail`` -- a broken candidate is the candidate's fault,
   whatever else went wrong in the run;
2. any other rule undecided: ``error`` -- a run that could not be judged is never a pass, and a
   broken baseline never fails a good candidate;
3. any rule failed: ``fail``;
4. otherwise ``pass``.

The noise floor is the A/A' pair (baseline vs the A/A' target) when the run has one, otherwise
the exact A/A twin; every "excess" is the candidate's figure minus the floor's. The drift, the
divergence-rate and the speed rules are statistical tests (``stats.py``): each fails only when
its effect is significant at ``alpha / 3`` AND beyond the policy's margin, and each reason
carries its test's statistic, p-value and decision. The hard-divergence rule stays a count: any
hard divergence in excess of the floor's fails.

Public API (stable, used by harnesses that grade faults against the gate): ``summarize(results,
prompts_total) -> Summary`` (``.candidate``, ``.aa``, ``.floor`` -- None without an A/A'
target --, ``.noise``, the floor actually used, and ``.speed``, per-role ``SpeedSamples``);
``decide(summary, gate_settings) -> Verdict`` (``.status`` pass/fail/error, ``.reasons``, each a
``Reason`` with ``.rule``, ``.outcome``, ``.message`` and ``.test``, a ``stats.TestResult`` for
the rules ``logprob_drift_p99``, ``excess_divergence_rate`` and ``speed``). A ``PromptResult``
carries the A/A' comparison in ``.floor`` and the A/A' answer as ``outcomes["floor"]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Literal

from kdtree_parity.compare import DriftStats, PairComparison
from kdtree_parity.policy import GateSettings
from kdtree_parity.results import ALL_ROLES, ROLES, TRANSPORT_KINDS, Outcome, PromptResult
from kdtree_parity.stats import (
    TestResult,
    drift_greater,
    median_ratio,
    more_divergences,
    per_test_alpha,
)

VerdictStatus = Literal["pass", "fail", "error"]
RuleOutcome = Literal["pass", "fail", "undecided"]


@dataclass(frozen=True)
class PairSummary:
    """Aggregates over the prompts where both sides of a pair produced a generation."""

    compared: int = 0
    exact: int = 0
    hard: int = 0
    near_tie: int = 0
    length_differs: int = 0
    finish_differs: int = 0
    finish_mismatch: int = 0  # the same tokens, another finish reason
    divergence_positions: tuple[int, ...] = ()
    hard_prompt_ids: tuple[str, ...] = ()
    finish_mismatch_prompt_ids: tuple[str, ...] = ()
    drift: DriftStats = field(default_factory=DriftStats)
    drift_values: tuple[float, ...] = ()

    @property
    def diverged(self) -> int:
        return self.compared - self.exact

    @property
    def exact_rate(self) -> float:
        return self.exact / self.compared if self.compared else 0.0

    @property
    def divergence_rate(self) -> float:
        return self.diverged / self.compared if self.compared else 0.0

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, PairComparison]]) -> PairSummary:
        drift_values: list[float] = []
        for _, c in pairs:
            drift_values.extend(c.drift_values)
        return cls(
            compared=len(pairs),
            exact=sum(c.exact for _, c in pairs),
            hard=sum(c.divergence_class == "hard" for _, c in pairs),
            near_tie=sum(c.divergence_class == "near_tie" for _, c in pairs),
            length_differs=sum(c.length_differs for _, c in pairs),
            finish_differs=sum(c.finish_differs for _, c in pairs),
            finish_mismatch=sum(c.finish_mismatch for _, c in pairs),
            divergence_positions=tuple(
                c.first_divergence for _, c in pairs if c.first_divergence is not None
            ),
            hard_prompt_ids=tuple(pid for pid, c in pairs if c.divergence_class == "hard"),
            finish_mismatch_prompt_ids=tuple(pid for pid, c in pairs if c.finish_mismatch),
            drift=DriftStats.of(drift_values),
            drift_values=tuple(drift_values),
        )


def decode_rate(outcome: Outcome) -> float | None:
    """Decode tokens/s of one answer: what the target's meta_info says (``Timing``), otherwise
    the output length over the client-side elapsed time; None without a generation."""
    g = outcome.generation
    if g is None:
        return None
    if g.timing is not None and g.timing.decode_tps is not None:
        return g.timing.decode_tps
    return len(g.output_ids) / outcome.elapsed_s if outcome.elapsed_s > 0 and g.output_ids else None


@dataclass(frozen=True)
class SpeedSamples:
    """Per-request decode rates (tokens/s) and times to first token (s) by role. The decode
    rates of every role cover the same prompts in the same order (paired by prompt)."""

    decode_tps: dict[str, tuple[float, ...]] = field(default_factory=dict)
    ttft_s: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def median_decode(self, role: str) -> float | None:
        values = self.decode_tps.get(role, ())
        return median(values) if values else None

    def median_ttft(self, role: str) -> float | None:
        values = self.ttft_s.get(role, ())
        return median(values) if values else None

    @classmethod
    def of(cls, results: Sequence[PromptResult]) -> SpeedSamples:
        rates: dict[str, list[float]] = {}
        ttfts: dict[str, list[float]] = {}
        for r in results:
            # Kept per prompt, in step across roles (a prompt counts only where every role has
            # a rate), so the speed interval can resample prompts as pairs.
            prompt_rates = {role: decode_rate(o) for role, o in r.outcomes.items()}
            if None not in prompt_rates.values():
                for role, rate in prompt_rates.items():
                    rates.setdefault(role, []).append(rate)
            for role, outcome in r.outcomes.items():
                timing = outcome.generation.timing if outcome.generation else None
                if timing is not None and timing.ttft_s is not None:
                    ttfts.setdefault(role, []).append(timing.ttft_s)
        return cls(
            {role: tuple(v) for role, v in rates.items()},
            {role: tuple(v) for role, v in ttfts.items()},
        )


@dataclass(frozen=True)
class Summary:
    """Everything the verdict is computed from."""

    prompts_total: int
    prompts_done: int
    prompts_compared: int
    errors: dict[str, dict[str, int]]  # role -> error kind -> count (decidable prompts only)
    candidate: PairSummary
    aa: PairSummary
    # Prompts the baseline itself refused with a 4xx: (prompt id, every target's error).
    undecidable: tuple[tuple[str, str], ...] = ()
    floor: PairSummary | None = None  # baseline vs the A/A' target, when the run has one
    speed: SpeedSamples = field(default_factory=SpeedSamples)

    @property
    def noise(self) -> PairSummary:
        """The noise floor the candidate is judged against: A/A' when present, else A/A."""
        return self.floor if self.floor is not None else self.aa

    @property
    def noise_is_exact(self) -> bool:
        """The floor shows no noise at all (a deterministic twin): nothing to test against, so
        the statistical rules fall back to their margins."""
        return self.noise.diverged == 0 and self.noise.drift.max == 0.0

    @property
    def noise_label(self) -> str:
        return "A/A'" if self.floor is not None else "A/A"

    @property
    def excess_divergence_rate(self) -> float:
        return self.candidate.divergence_rate - self.noise.divergence_rate

    @property
    def excess_hard(self) -> int:
        return self.candidate.hard - self.noise.hard

    @property
    def excess_drift_p99(self) -> float:
        return self.candidate.drift.p99 - self.noise.drift.p99

    @property
    def excess_finish_mismatch(self) -> int:
        return self.candidate.finish_mismatch - self.noise.finish_mismatch

    def error_count(self, role: str, transport: bool | None = None) -> int:
        return sum(
            n
            for kind, n in self.errors.get(role, {}).items()
            if transport is None or (kind in TRANSPORT_KINDS) == transport
        )


# Client errors that say "not now" rather than "not this request".
_NOT_NOW = frozenset({408, 429})


def baseline_rejected(result: PromptResult) -> bool:
    """The baseline refused this very request with a client error (e.g. 400, prompt too long):
    the prompt cannot decide anything, and whatever the other targets answered is not evidence.
    A baseline failing with a 5xx is a broken baseline instead (``baseline_errors``)."""
    error = result.outcomes["baseline"].error
    code = error.status_code if error is not None and error.kind == "http" else None
    return code is not None and 400 <= code < 500 and code not in _NOT_NOW


def summarize(results: Sequence[PromptResult], prompts_total: int) -> Summary:
    """Aggregate stored prompt results. Only prompts where every request succeeded count
    towards any pair, so the candidate, A/A and A/A' figures cover the same prompts. Errors on a
    prompt the baseline rejected are not counted against anyone: the prompt is undecidable."""
    with_floor = any("floor" in r.outcomes for r in results)
    roles = ALL_ROLES if with_floor else ROLES
    errors: dict[str, Counter[str]] = {role: Counter() for role in roles}
    complete = []
    undecidable = []
    for r in results:
        if baseline_rejected(r):
            why = "; ".join(
                f"{role}: {o.error.message}" for role, o in r.outcomes.items() if o.error
            )
            undecidable.append((r.entry.id, why))
            continue
        for role, outcome in r.outcomes.items():
            if outcome.error is not None:
                errors[role][outcome.error.kind] += 1
        if (
            not r.has_error
            and r.candidate is not None
            and r.aa is not None
            and (r.floor is not None or not with_floor)
        ):
            complete.append(r)
    return Summary(
        prompts_total=prompts_total,
        prompts_done=len(results),
        prompts_compared=len(complete),
        errors={role: dict(c) for role, c in errors.items()},
        candidate=PairSummary.of([(r.entry.id, r.candidate) for r in complete]),
        aa=PairSummary.of([(r.entry.id, r.aa) for r in complete]),
        undecidable=tuple(undecidable),
        floor=PairSummary.of([(r.entry.id, r.floor) for r in complete if r.floor is not None])
        if with_floor
        else None,
        speed=SpeedSamples.of(complete),
    )


@dataclass(frozen=True)
class Reason:
    """One rule of the policy applied to one run."""

    rule: str
    outcome: RuleOutcome
    message: str
    test: TestResult | None = None  # the statistical test behind the rule, if any


@dataclass(frozen=True)
class Verdict:
    status: VerdictStatus
    reasons: tuple[Reason, ...]

    @property
    def failing(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.outcome != "pass")


CANDIDATE_FAULT_RULES = frozenset({"candidate_errors"})


def decide(
    summary: Summary,
    gate: GateSettings,
    *,
    aborted_because: str | None = None,
    candidate_refused: str | None = None,
) -> Verdict:
    """Apply every rule of ``gate`` to ``summary``.

    ``candidate_refused`` says why the candidate was never replayed although it answered (its
    health check returned an HTTP error): that counts as a candidate error.
    """
    reasons: list[Reason] = []

    def rule(
        name: str, ok: bool, bad: RuleOutcome, message: str, test: TestResult | None = None
    ) -> None:
        reasons.append(Reason(name, "pass" if ok else bad, message, test))

    def compared_rule(
        name: str, pair: PairSummary, ok: bool, message: str, test: TestResult | None = None
    ) -> None:
        # A rate or a percentile of nothing is not evidence either way.
        if pair.compared == 0:
            rule(name, False, "undecided", "no prompt was compared on every target", test)
        else:
            rule(name, ok, "fail", message, test)

    c, aa, noise, label = summary.candidate, summary.aa, summary.noise, summary.noise_label
    level = per_test_alpha(gate.alpha)
    done = summary.prompts_done == summary.prompts_total and aborted_because is None
    rule(
        "complete",
        done,
        "undecided",
        f"{summary.prompts_done} of {summary.prompts_total} prompts replayed"
        + (f"; run stopped: {aborted_because}" if aborted_because else ""),
    )
    base_roles = ("baseline", "aa", "floor") if summary.floor is not None else ("baseline", "aa")
    baseline_errors = sum(summary.error_count(role) for role in base_roles)
    rule(
        "baseline_errors",
        baseline_errors == 0,
        "undecided",
        f"{baseline_errors} baseline/A-A{'/A-Aprime' if summary.floor is not None else ''} "
        f"request error(s) {_kinds(summary.errors, base_roles)}".rstrip(),
    )
    rule(
        "undecidable_prompts",
        not summary.undecidable,
        "undecided",
        f"{len(summary.undecidable)} prompt(s) the baseline rejected too cannot decide anything"
        + "".join(f"; {pid} ({why[:300]})" for pid, why in summary.undecidable[:10])
        + (" ..." if len(summary.undecidable) > 10 else ""),
    )
    unreachable = summary.error_count("candidate", transport=True)
    rule(
        "candidate_reachable",
        unreachable == 0,
        "undecided",
        f"{unreachable} candidate request(s) got no answer (connect/timeout/503)",
    )
    refused = summary.error_count("candidate", transport=False)
    rule(
        "candidate_errors",
        refused <= gate.max_candidate_errors and candidate_refused is None,
        "fail",
        f"{refused} candidate request(s) answered with an error or a malformed body "
        f"(max {gate.max_candidate_errors})"
        + (f"; {candidate_refused}" if candidate_refused else ""),
    )
    rule(
        "min_prompts",
        summary.prompts_compared >= gate.min_prompts,
        "undecided",
        f"{summary.prompts_compared} prompts compared on every target (min {gate.min_prompts})",
    )
    rule(
        "aa_exact",
        gate.allow_aa_divergence or aa.diverged == 0,
        "undecided",
        f"A/A: {aa.diverged} of {aa.compared} prompts differ between the baseline and its twin"
        + ("" if gate.allow_aa_divergence else " (the baseline must be deterministic)"),
    )
    hard_ids = ", ".join(c.hard_prompt_ids[:20]) + (" ..." if len(c.hard_prompt_ids) > 20 else "")
    rule(
        "hard_divergences",
        summary.excess_hard <= gate.max_hard_divergences,
        "fail",
        f"{c.hard} hard divergence(s) vs {noise.hard} in {label}, excess {summary.excess_hard} "
        f"(max {gate.max_hard_divergences})" + (f": {hard_ids}" if hard_ids else ""),
    )
    compared_rule(
        "exact_match_rate",
        c,
        c.exact_rate >= gate.min_exact_match_rate,
        f"candidate exact-match rate {c.exact_rate:.3f} ({c.exact}/{c.compared}), "
        f"min {gate.min_exact_match_rate:g}",
    )
    _divergence_rule(compared_rule, summary, gate, level)
    mismatch_ids = ", ".join(c.finish_mismatch_prompt_ids[:20]) + (
        " ..." if len(c.finish_mismatch_prompt_ids) > 20 else ""
    )
    compared_rule(
        "finish_reasons",
        c,
        summary.excess_finish_mismatch <= gate.max_finish_mismatches,
        f"{c.finish_mismatch} prompt(s) with the baseline's tokens but another finish reason vs "
        f"{noise.finish_mismatch} in {label}, excess {summary.excess_finish_mismatch} "
        f"(max {gate.max_finish_mismatches})" + (f": {mismatch_ids}" if mismatch_ids else ""),
    )
    _drift_rule(rule, summary, gate, level)
    _speed_rule(rule, summary, gate, level)
    return Verdict(_status(reasons), tuple(reasons))


RuleFn = Callable[..., None]


def _decision(significant: bool, beyond_margin: bool) -> RuleOutcome:
    return "fail" if significant and beyond_margin else "pass"


def _floor_test(
    name: str,
    method: str,
    statistic: float | None,
    p: float | None,
    level: float,
    beyond_margin: bool,
    exact_floor: bool,
    estimate: float,
) -> tuple[bool, TestResult]:
    """(significant, the test's record) for a rule judged against the floor: on an exact floor
    every difference is real and the margin alone decides; otherwise the test must reject at
    ``level`` as well."""
    significant = exact_floor or (p is not None and p < level)
    test = TestResult(
        name=name,
        method=_EXACT_FLOOR if exact_floor else method,
        statistic=statistic,
        p_value=p,
        alpha=level,
        decision=_decision(significant, beyond_margin) if p is not None else "undecided",
        estimate=estimate,
    )
    return significant, test


def _divergence_rule(
    compared_rule: RuleFn, summary: Summary, gate: GateSettings, level: float
) -> None:
    """More prompts diverging than on the floor: Fisher exact, one-sided, and beyond the
    policy's rate margin."""
    c, noise, label = summary.candidate, summary.noise, summary.noise_label
    odds, p = more_divergences(c.diverged, c.compared, noise.diverged, noise.compared)
    beyond = summary.excess_divergence_rate > gate.max_excess_divergence_rate
    exact_floor = summary.noise_is_exact
    significant, test = _floor_test(
        "divergence_count",
        "Fisher exact, one-sided (candidate diverges more often than the floor)",
        odds,
        p,
        level,
        beyond,
        exact_floor,
        summary.excess_divergence_rate,
    )
    compared_rule(
        "excess_divergence_rate",
        c,
        not (significant and beyond),
        f"divergence rate {c.divergence_rate:.3f} vs {label} {noise.divergence_rate:.3f}, "
        f"excess {summary.excess_divergence_rate:.3f} (max {gate.max_excess_divergence_rate:g}); "
        + _significance("Fisher", p, level, significant, exact_floor),
        test,
    )


def _drift_rule(rule: RuleFn, summary: Summary, gate: GateSettings, level: float) -> None:
    """Per-position drift larger than the floor's: Mann-Whitney U, one-sided, and a p99 excess
    beyond the policy's margin. Drift measured at no position at all is not a pass: with no
    position on the floor pair either, the baseline reports no logprobs to measure against
    (undecided); with floor positions but none on the candidate, the candidate agreed with the
    baseline on no first token (fail; a candidate leaving out logprobs is a malformed answer,
    counted by candidate_errors before it gets here)."""
    c, noise, label = summary.candidate, summary.noise, summary.noise_label
    if c.compared == 0:
        rule("logprob_drift_p99", False, "undecided", "no prompt was compared on every target")
        return
    if c.drift.count == 0:
        rule(
            "logprob_drift_p99",
            False,
            "fail" if noise.drift.count else "undecided",
            "logprob drift not measured: no position before a first divergence where both the "
            "baseline and the candidate report the chosen token's logprob"
            + (
                f" ({label}: {noise.drift.count})"
                if noise.drift.count
                else f"; the baseline reports none against its {label} target either"
            ),
        )
        return
    u, p = drift_greater(c.drift_values, noise.drift_values)
    beyond = summary.excess_drift_p99 > gate.max_logprob_drift_p99
    exact_floor = summary.noise_is_exact and noise.drift.count > 0
    significant, test = _floor_test(
        "logprob_drift",
        "Mann-Whitney U, one-sided (candidate drift stochastically greater than the floor)",
        u,
        p,
        level,
        beyond,
        exact_floor,
        summary.excess_drift_p99,
    )
    if p is None:  # positions on the candidate pair but none on the floor pair
        rule(
            "logprob_drift_p99",
            False,
            "undecided",
            f"logprob drift measured at {c.drift.count} candidate positions but at none on the "
            f"{label} pair: no floor to compare with",
            test,
        )
        return
    rule(
        "logprob_drift_p99",
        not (significant and beyond),
        "fail",
        f"p99 logprob drift {c.drift.p99:.3g} over {c.drift.count} positions vs {label} "
        f"{noise.drift.p99:.3g} over {noise.drift.count}, excess {summary.excess_drift_p99:.3g} "
        f"(max {gate.max_logprob_drift_p99:g}); "
        + _significance("Mann-Whitney", p, level, significant, exact_floor),
        test,
    )


def _speed_rule(rule: RuleFn, summary: Summary, gate: GateSettings, level: float) -> None:
    """The candidate's median decode rate over the baseline's, with a bootstrap interval at
    ``1 - level`` (prompts resampled as pairs: a prompt's requests ran at the same time, so the
    pairing takes out prompt length and machine load). It fails when the whole interval lies
    below ``(1 - max_slowdown)`` times the A/A ratio (the twin's rate over the baseline's on
    the same prompts, capped at 1; its interval is reported as the A/A spread): the candidate
    is slower than the baseline by more than the policy allows beyond what timing noise shows."""
    if gate.max_slowdown is None:
        rule("speed", True, "fail", "no speed rule (max_slowdown: null)")
        return
    speed = summary.speed
    base = speed.decode_tps.get("baseline", ())
    cand = speed.decode_tps.get("candidate", ())
    ratio = median_ratio(cand, base, level)
    spread = median_ratio(speed.decode_tps.get("aa", ()), base, level)
    if ratio is None or spread is None:
        rule(
            "speed",
            False,
            "undecided",
            f"decode rates measured on {len(cand)} candidate and {len(base)} baseline requests: "
            "nothing to compare",
        )
        return
    (estimate, (low, high)), (aa_ratio, (aa_low, aa_high)) = ratio, spread
    bound = (1 - gate.max_slowdown) * min(1.0, aa_ratio)
    slower = high < bound
    test = TestResult(
        name="decode_speed",
        method=f"median decode tokens/s ratio, candidate/baseline, bootstrap percentile "
        f"interval at {1 - level:.3g}",
        statistic=estimate,
        p_value=None,
        alpha=level,
        decision="fail" if slower else "pass",
        estimate=estimate,
        interval=(low, high),
    )
    ttft = speed.median_ttft("candidate"), speed.median_ttft("baseline")
    rule(
        "speed",
        not slower,
        "fail",
        f"median decode {speed.median_decode('candidate'):.4g} vs baseline "
        f"{speed.median_decode('baseline'):.4g} tokens/s, ratio {estimate:.3f} "
        f"[{low:.3f}, {high:.3f}]; A/A ratio {aa_ratio:.3f} [{aa_low:.3f}, {aa_high:.3f}]; "
        f"refused when the interval lies below "
        f"{bound:.3f} (max_slowdown {gate.max_slowdown:g})"
        + (
            f"; median time to first token {ttft[0]:.4g}s vs {ttft[1]:.4g}s"
            if None not in ttft
            else ""
        ),
        test,
    )


# A deterministic floor (an exact twin: no divergence, zero drift) has no noise to test against:
# any difference from it is real, and the margin alone decides.
_EXACT_FLOOR = "deterministic floor: every difference is real, the margin alone decides"


def _significance(
    name: str, p: float | None, level: float, significant: bool, exact_floor: bool
) -> str:
    if exact_floor:
        return f"{name} p={_p(p)}, not used: the floor is deterministic (the margin decides)"
    verdict = "significant" if significant else "not significant"
    return f"{name} p={_p(p)} (alpha {level:.3g}): {verdict}"


def _p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def _status(reasons: list[Reason]) -> VerdictStatus:
    """The precedence of the module docstring."""
    if any(r.outcome == "fail" and r.rule in CANDIDATE_FAULT_RULES for r in reasons):
        return "fail"
    outcomes = {r.outcome for r in reasons}
    return "error" if "undecided" in outcomes else "fail" if "fail" in outcomes else "pass"


def _kinds(errors: dict[str, dict[str, int]], roles: tuple[str, ...]) -> str:
    parts = [f"{role}:{kind}={n}" for role in roles for kind, n in sorted(errors[role].items())]
    return f"({', '.join(parts)})" if parts else ""
