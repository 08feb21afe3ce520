"""Aggregate per-prompt results and decide: pass, fail, or error (could not decide).

Every rule is evaluated and reported, passing or not, so a verdict always carries all its
reasons. A rule's failure is either ``fail`` (the candidate is worse than the policy allows) or
``undecided`` (the run cannot support a decision: incomplete, a baseline or transport error, a
prompt the baseline rejected too, too few prompts, a non-deterministic baseline, drift that could
not be measured on the baseline). Precedence, first match wins:

1. the candidate answered with errors (an HTTP error, a malformed body, a refused health check)
   beyond ``max_candidate_errors``: ``fail`` -- a broken candidate is the candidate's fault,
   whatever else went wrong in the run;
2. a rule about the run itself undecided (incomplete, a broken baseline or reference target,
   too few prompts, ...): ``error`` -- a broken baseline never fails a good candidate;
3. any rule failed: ``fail`` -- the data show the candidate beyond a margin, and a rule that
   could not show it within one (below) does not change that;
4. a rule of evidence undecided (``EVIDENCE_RULES``: the data show the candidate neither within
   nor beyond the margin): ``error`` -- a run that could not be judged is never a pass;
5. otherwise ``pass``.

The noise floor is the A/A' pair (baseline vs the A/A' target) when the run has one, otherwise
the exact A/A twin; every "excess" is the candidate's figure minus the floor's. The drift, the
divergence-rate and the speed rules are non-inferiority tests (``noninferiority.py``): each
passes only when the data show the candidate within the policy's margin of the floor, fails
when they show it beyond, and is undecided otherwise; the drift is judged three ways (the p99
excess, the positions above the floor's p99 plus the margin, the per-prompt maxima). Each reason
carries its test's statistic, interval or p-value, decision and power. The hard-divergence rule
stays a count: any hard divergence in excess of the floor's fails.

Public API (stable, used by harnesses that grade faults against the gate): ``summarize(results,
prompts_total) -> Summary`` (``.candidate``, ``.aa``, ``.floor`` -- None without an A/A'
target --, ``.noise``, the floor actually used, and ``.speed``, per-role ``SpeedSamples``);
``decide(summary, gate_settings) -> Verdict`` (``.status`` pass/fail/error, ``.reasons``, each a
``Reason`` with ``.rule``, ``.outcome``, ``.message`` and ``.test``, a ``stats.TestResult`` for
the rules ``logprob_drift_p99``, ``logprob_drift_tail``, ``logprob_drift_prompt_max``,
``excess_divergence_rate`` and ``speed``). A ``PromptResult``
carries the A/A' comparison in ``.floor`` and the A/A' answer as ``outcomes["floor"]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Literal

from kdtree_parity import noninferiority
from kdtree_parity.compare import DriftStats, PairComparison
from kdtree_parity.noninferiority import Judgement
from kdtree_parity.policy import GateSettings
from kdtree_parity.reference_targets import agreement_problems
from kdtree_parity.results import ALL_ROLES, ROLES, TRANSPORT_KINDS, Outcome, PromptResult
from kdtree_parity.stats import TestResult, per_test_alpha

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
    # Per compared prompt, in the order of the run's compared prompts (the same for every pair).
    drift_by_prompt: tuple[tuple[float, ...], ...] = ()
    diverged_by_prompt: tuple[bool, ...] = ()

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
            drift_by_prompt=tuple(c.drift_values for _, c in pairs),
            diverged_by_prompt=tuple(not c.exact for _, c in pairs),
        )


def decode_rate(outcome: Outcome) -> float | None:
    """Tokens/s of one answer by the sidecar's own clock: the output length over the request's
    end-to-end time as the sidecar measured it (the same field for every target, whatever the
    target says about itself); None without a generation."""
    g = outcome.generation
    if g is None:
        return None
    return len(g.output_ids) / outcome.elapsed_s if outcome.elapsed_s > 0 and g.output_ids else None


def reported_decode_rate(outcome: Outcome) -> float | None:
    """The decode tokens/s the target reports about itself (``meta_info``): shown, never used."""
    g = outcome.generation
    return g.timing.decode_tps if g is not None and g.timing is not None else None


@dataclass(frozen=True)
class SpeedSamples:
    """Per-request rates (tokens/s, by the sidecar's clock) and times to first token (s, as the
    target reports them) by role. The rates of every role cover the same prompts in the same
    order (paired by prompt); ``reported_decode_tps`` is what each target says of itself."""

    decode_tps: dict[str, tuple[float, ...]] = field(default_factory=dict)
    ttft_s: dict[str, tuple[float, ...]] = field(default_factory=dict)
    reported_decode_tps: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def median_reported(self, role: str) -> float | None:
        values = self.reported_decode_tps.get(role, ())
        return median(values) if values else None

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
        reported: dict[str, list[float]] = {}
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
                if (rate := reported_decode_rate(outcome)) is not None:
                    reported.setdefault(role, []).append(rate)
        return cls(
            {role: tuple(v) for role, v in rates.items()},
            {role: tuple(v) for role, v in ttfts.items()},
            {role: tuple(v) for role, v in reported.items()},
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
# The rules judged by a non-inferiority test: undecided means the data were not enough.
EVIDENCE_RULES = frozenset(
    {
        "excess_divergence_rate",
        "logprob_drift_p99",
        "logprob_drift_tail",
        "logprob_drift_prompt_max",
        "speed",
    }
)


class _Rules:
    """The reasons of one verdict, in the order the rules are applied. Called as ``rules(name,
    ok, bad, message, test)``: the rule passes when ``ok``, else its outcome is ``bad``."""

    def __init__(self) -> None:
        self.reasons: list[Reason] = []

    def __call__(
        self, name: str, ok: bool, bad: RuleOutcome, message: str, test: TestResult | None = None
    ) -> None:
        self.reasons.append(Reason(name, "pass" if ok else bad, message, test))

    def compared(
        self, name: str, pair: PairSummary, ok: bool, message: str, test: TestResult | None = None
    ) -> None:
        """A rule over the prompts ``pair`` compared: a rate or a percentile of nothing is not
        evidence either way (undecided)."""
        if pair.compared == 0:
            self(name, False, "undecided", "no prompt was compared on every target", test)
        else:
            self(name, ok, "fail", message, test)


def decide(
    summary: Summary,
    gate: GateSettings,
    *,
    aborted_because: str | None = None,
    candidate_refused: str | None = None,
    reference_problems: Sequence[str] = (),
) -> Verdict:
    """Apply every rule of ``gate`` to ``summary``.

    ``candidate_refused`` says why the candidate was never replayed although it answered (its
    health check returned an HTTP error): that counts as a candidate error.
    ``reference_problems``: what the targets' identities showed wrong with the reference
    targets (``reference_targets.identity_problems``); the floor's and the twin's agreement with
    the baseline is checked here.
    """
    rules = _Rules()
    level = per_test_alpha(gate.alpha)
    _completeness_rules(rules, summary, aborted_because)
    _reference_rule(rules, summary, gate, reference_problems)
    _candidate_error_rules(rules, summary, gate, candidate_refused)
    _sample_rules(rules, summary, gate)
    _match_rules(rules, summary, gate)
    _divergence_rule(rules, rules.compared, summary, gate, level)
    _finish_reason_rule(rules, summary, gate)
    _drift_rule(rules, summary, gate, level)
    _speed_rule(rules, summary, gate, level)
    return Verdict(verdict_status(rules.reasons), tuple(rules.reasons))


def _completeness_rules(rules: _Rules, summary: Summary, aborted_because: str | None) -> None:
    """complete, baseline_errors, undecidable_prompts: whether the run has what a verdict needs."""
    done = summary.prompts_done == summary.prompts_total and aborted_because is None
    rules(
        "complete",
        done,
        "undecided",
        f"{summary.prompts_done} of {summary.prompts_total} prompts replayed"
        + (f"; run stopped: {aborted_because}" if aborted_because else ""),
    )
    base_roles = ("baseline", "aa", "floor") if summary.floor is not None else ("baseline", "aa")
    baseline_errors = sum(summary.error_count(role) for role in base_roles)
    rules(
        "baseline_errors",
        baseline_errors == 0,
        "undecided",
        f"{baseline_errors} baseline/A-A{'/A-Aprime' if summary.floor is not None else ''} "
        f"request error(s) {_kinds(summary.errors, base_roles)}".rstrip(),
    )
    rules(
        "undecidable_prompts",
        not summary.undecidable,
        "undecided",
        f"{len(summary.undecidable)} prompt(s) the baseline rejected too cannot decide anything"
        + "".join(f"; {pid} ({why[:300]})" for pid, why in summary.undecidable[:10])
        + (" ..." if len(summary.undecidable) > 10 else ""),
    )


def _reference_rule(
    rules: _Rules, summary: Summary, gate: GateSettings, reference_problems: Sequence[str]
) -> None:
    """reference_targets: the identities' problems, and the floor's and the twin's agreement
    with the baseline."""
    floor = summary.floor
    problems = [
        *reference_problems,
        *agreement_problems(
            floor.hard if floor is not None else None,
            floor.drift.p99 if floor is not None and floor.drift.count else None,
            summary.aa.hard,
            gate.max_floor_drift_p99,
        ),
    ]
    rules(
        "reference_targets",
        not problems,
        "undecided",
        "; ".join(problems)
        or (
            f"the {summary.noise_label} reference agrees with the baseline within the floor "
            f"bounds (no hard divergence, p99 drift at most {gate.max_floor_drift_p99:g})"
        ),
    )


def _candidate_error_rules(
    rules: _Rules, summary: Summary, gate: GateSettings, candidate_refused: str | None
) -> None:
    """candidate_reachable (no answer: undecided), candidate_errors (a wrong answer: fail)."""
    unreachable = summary.error_count("candidate", transport=True)
    rules(
        "candidate_reachable",
        unreachable == 0,
        "undecided",
        f"{unreachable} candidate request(s) got no answer (connect/timeout/503)",
    )
    refused = summary.error_count("candidate", transport=False)
    rules(
        "candidate_errors",
        refused <= gate.max_candidate_errors and candidate_refused is None,
        "fail",
        f"{refused} candidate request(s) answered with an error or a malformed body "
        f"(max {gate.max_candidate_errors})"
        + (f"; {candidate_refused}" if candidate_refused else ""),
    )


def _sample_rules(rules: _Rules, summary: Summary, gate: GateSettings) -> None:
    """min_prompts, aa_exact: enough prompts compared, and a deterministic baseline."""
    aa = summary.aa
    rules(
        "min_prompts",
        summary.prompts_compared >= gate.min_prompts,
        "undecided",
        f"{summary.prompts_compared} prompts compared on every target (min {gate.min_prompts})",
    )
    rules(
        "aa_exact",
        gate.allow_aa_divergence or aa.diverged == 0,
        "undecided",
        f"A/A: {aa.diverged} of {aa.compared} prompts differ between the baseline and its twin"
        + ("" if gate.allow_aa_divergence else " (the baseline must be deterministic)"),
    )


def _first_ids(ids: Sequence[str], shown: int = 20) -> str:
    return ", ".join(ids[:shown]) + (" ..." if len(ids) > shown else "")


def _match_rules(rules: _Rules, summary: Summary, gate: GateSettings) -> None:
    """hard_divergences (the excess over the noise), exact_match_rate."""
    c, noise, label = summary.candidate, summary.noise, summary.noise_label
    hard_ids = _first_ids(c.hard_prompt_ids)
    rules(
        "hard_divergences",
        summary.excess_hard <= gate.max_hard_divergences,
        "fail",
        f"{c.hard} hard divergence(s) vs {noise.hard} in {label}, excess {summary.excess_hard} "
        f"(max {gate.max_hard_divergences})" + (f": {hard_ids}" if hard_ids else ""),
    )
    rules.compared(
        "exact_match_rate",
        c,
        c.exact_rate >= gate.min_exact_match_rate,
        f"candidate exact-match rate {c.exact_rate:.3f} ({c.exact}/{c.compared}), "
        f"min {gate.min_exact_match_rate:g}",
    )


def _finish_reason_rule(rules: _Rules, summary: Summary, gate: GateSettings) -> None:
    """finish_reasons: the baseline's tokens with another finish reason, in excess of the noise."""
    c, noise, label = summary.candidate, summary.noise, summary.noise_label
    mismatch_ids = _first_ids(c.finish_mismatch_prompt_ids)
    rules.compared(
        "finish_reasons",
        c,
        summary.excess_finish_mismatch <= gate.max_finish_mismatches,
        f"{c.finish_mismatch} prompt(s) with the baseline's tokens but another finish reason vs "
        f"{noise.finish_mismatch} in {label}, excess {summary.excess_finish_mismatch} "
        f"(max {gate.max_finish_mismatches})" + (f": {mismatch_ids}" if mismatch_ids else ""),
    )


RuleFn = Callable[..., None]


def _divergence_rule(
    rule: RuleFn, compared_rule: RuleFn, summary: Summary, gate: GateSettings, level: float
) -> None:
    """The divergence-rate excess over the floor, shown within the policy's margin (a paired
    bootstrap interval over prompts, ``noninferiority.divergence_rate``)."""
    c, noise, label = summary.candidate, summary.noise, summary.noise_label
    if c.compared == 0:
        compared_rule("excess_divergence_rate", c, False, "")
        return
    judged = noninferiority.divergence_rate(
        c.diverged_by_prompt, noise.diverged_by_prompt, gate.max_excess_divergence_rate, level
    )
    _judged_rule(
        rule,
        "excess_divergence_rate",
        judged,
        f"divergence rate {c.divergence_rate:.3f} vs {label} {noise.divergence_rate:.3f}, ",
    )


def _judged_rule(rule: RuleFn, name: str, judged: Judgement, lead: str) -> None:
    """A rule decided by a non-inferiority judgement: pass, fail or undecided as judged."""
    verdict = {"pass": "shown within the margin", "fail": "shown beyond the margin"}.get(
        judged.outcome, "could not decide: the data show it neither within nor beyond the margin"
    )
    rule(
        name,
        judged.outcome == "pass",
        judged.outcome,
        f"{lead}{judged.summary}: {verdict}",
        judged.test,
    )


def _drift_rule(rule: RuleFn, summary: Summary, gate: GateSettings, level: float) -> None:
    """Per-position drift judged against the floor by three tests (``noninferiority``): the p99
    excess within the margin, the share of positions above the floor's p99 plus the margin,
    and the per-prompt maxima. Drift measured at no position at all is not a pass: with no
    position on the floor pair either, the baseline reports no logprobs to measure against
    (undecided); with floor positions but none on the candidate, the candidate agreed with the
    baseline on no first token (fail; a candidate leaving out logprobs is a malformed answer,
    counted by candidate_errors before it gets here)."""
    c, noise, label = summary.candidate, summary.noise, summary.noise_label
    names = ("logprob_drift_p99", "logprob_drift_tail", "logprob_drift_prompt_max")
    if c.compared == 0:
        for name in names:
            rule(name, False, "undecided", "no prompt was compared on every target")
        return
    if c.drift.count == 0 or noise.drift.count == 0:
        if c.drift.count == 0:
            why = (
                "logprob drift not measured: no position before a first divergence where both "
                "the baseline and the candidate report the chosen token's logprob"
                + (
                    f" ({label}: {noise.drift.count})"
                    if noise.drift.count
                    else f"; the baseline reports none against its {label} target either"
                )
            )
            bad: RuleOutcome = "fail" if noise.drift.count else "undecided"
        else:
            why = (
                f"logprob drift measured at {c.drift.count} candidate positions but at none on "
                f"the {label} pair: no floor to compare with"
            )
            bad = "undecided"
        for name in names:
            rule(name, False, bad, why)
        return
    margin = gate.max_logprob_drift_p99
    lead = (
        f"p99 logprob drift {c.drift.p99:.3g} (max {c.drift.max:.3g}) over {c.drift.count} "
        f"positions vs {label} {noise.drift.p99:.3g} (max {noise.drift.max:.3g}) over "
        f"{noise.drift.count}; "
    )
    judgements = (
        noninferiority.drift_p99(c.drift_by_prompt, noise.drift_by_prompt, margin, level),
        noninferiority.drift_exceedances(c.drift_values, noise.drift_values, margin, level),
        noninferiority.drift_prompt_maxima(c.drift_by_prompt, noise.drift_by_prompt, margin, level),
    )
    for name, judged in zip(names, judgements, strict=True):
        _judged_rule(rule, name, judged, lead)


def _speed_rule(rule: RuleFn, summary: Summary, gate: GateSettings, level: float) -> None:
    """The candidate's median tokens/s over the baseline's, both by the sidecar's clock
    (``decode_rate``), shown to be at least ``1 - max_slowdown`` (``noninferiority.speed_ratio``);
    what each target reports about its own speed is printed and never decides. The A/A twin's
    ratio is the run's timing noise: it can make the rule undecided, never more lenient."""
    if gate.max_slowdown is None:
        rule("speed", True, "fail", "no speed rule (max_slowdown: null)")
        return
    speed = summary.speed
    base = speed.decode_tps.get("baseline", ())
    cand = speed.decode_tps.get("candidate", ())
    judged = noninferiority.speed_ratio(
        cand, base, speed.decode_tps.get("aa", ()), gate.max_slowdown, level
    )
    if judged is None:
        rule(
            "speed",
            False,
            "undecided",
            f"tokens/s measured on {len(cand)} candidate and {len(base)} baseline requests: "
            "nothing to compare",
        )
        return
    reported = speed.median_reported("candidate"), speed.median_reported("baseline")
    ttft = speed.median_ttft("candidate"), speed.median_ttft("baseline")
    rule(
        "speed",
        judged.outcome == "pass",
        judged.outcome,
        f"median {speed.median_decode('candidate'):.4g} vs baseline "
        f"{speed.median_decode('baseline'):.4g} tokens/s by the sidecar's clock, "
        f"{judged.summary}; refused below {1 - gate.max_slowdown:.3f} "
        f"(max_slowdown {gate.max_slowdown:g})"
        + (
            f"; self-reported decode {reported[0]:.4g} vs {reported[1]:.4g} tokens/s (not used)"
            if None not in reported
            else ""
        )
        + (
            f"; median time to first token {ttft[0]:.4g}s vs {ttft[1]:.4g}s"
            if None not in ttft
            else ""
        ),
        judged.test,
    )


def verdict_status(reasons: Sequence[Reason]) -> VerdictStatus:
    """The precedence of the module docstring, over every reason of a verdict."""
    if any(r.outcome == "fail" and r.rule in CANDIDATE_FAULT_RULES for r in reasons):
        return "fail"
    if any(r.outcome == "undecided" and r.rule not in EVIDENCE_RULES for r in reasons):
        return "error"
    outcomes = {r.outcome for r in reasons}
    return "fail" if "fail" in outcomes else "error" if "undecided" in outcomes else "pass"


def _kinds(errors: dict[str, dict[str, int]], roles: tuple[str, ...]) -> str:
    parts = [f"{role}:{kind}={n}" for role in roles for kind, n in sorted(errors[role].items())]
    return f"({', '.join(parts)})" if parts else ""
