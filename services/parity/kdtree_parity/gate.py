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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kdtree_parity.compare import DriftStats, PairComparison
from kdtree_parity.policy import GateSettings
from kdtree_parity.results import ROLES, TRANSPORT_KINDS, PromptResult

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

    @property
    def excess_divergence_rate(self) -> float:
        return self.candidate.divergence_rate - self.aa.divergence_rate

    @property
    def excess_hard(self) -> int:
        return self.candidate.hard - self.aa.hard

    @property
    def excess_drift_p99(self) -> float:
        return self.candidate.drift.p99 - self.aa.drift.p99

    @property
    def excess_finish_mismatch(self) -> int:
        return self.candidate.finish_mismatch - self.aa.finish_mismatch

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
    """Aggregate stored prompt results. Only prompts where all three requests succeeded count
    towards either pair, so the candidate and A/A figures cover the same prompts. Errors on a
    prompt the baseline rejected are not counted against anyone: the prompt is undecidable."""
    errors: dict[str, Counter[str]] = {role: Counter() for role in ROLES}
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
        if not r.has_error and r.candidate is not None and r.aa is not None:
            complete.append(r)
    return Summary(
        prompts_total=prompts_total,
        prompts_done=len(results),
        prompts_compared=len(complete),
        errors={role: dict(c) for role, c in errors.items()},
        candidate=PairSummary.of([(r.entry.id, r.candidate) for r in complete]),
        aa=PairSummary.of([(r.entry.id, r.aa) for r in complete]),
        undecidable=tuple(undecidable),
    )


@dataclass(frozen=True)
class Reason:
    """One rule of the policy applied to one run."""

    rule: str
    outcome: RuleOutcome
    message: str


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

    def rule(name: str, ok: bool, bad: RuleOutcome, message: str) -> None:
        reasons.append(Reason(name, "pass" if ok else bad, message))

    def compared_rule(name: str, pair: PairSummary, ok: bool, message: str) -> None:
        # A rate or a percentile of nothing is not evidence either way.
        if pair.compared == 0:
            rule(name, False, "undecided", "no prompt was compared on every target")
        else:
            rule(name, ok, "fail", message)

    c, aa = summary.candidate, summary.aa
    done = summary.prompts_done == summary.prompts_total and aborted_because is None
    rule(
        "complete",
        done,
        "undecided",
        f"{summary.prompts_done} of {summary.prompts_total} prompts replayed"
        + (f"; run stopped: {aborted_because}" if aborted_because else ""),
    )
    baseline_errors = summary.error_count("baseline") + summary.error_count("aa")
    rule(
        "baseline_errors",
        baseline_errors == 0,
        "undecided",
        f"{baseline_errors} baseline/A-A request error(s) "
        f"{_kinds(summary.errors, ('baseline', 'aa'))}".rstrip(),
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
        f"{c.hard} hard divergence(s) vs {aa.hard} in A/A, excess {summary.excess_hard} "
        f"(max {gate.max_hard_divergences})" + (f": {hard_ids}" if hard_ids else ""),
    )
    compared_rule(
        "exact_match_rate",
        c,
        c.exact_rate >= gate.min_exact_match_rate,
        f"candidate exact-match rate {c.exact_rate:.3f} ({c.exact}/{c.compared}), "
        f"min {gate.min_exact_match_rate:g}",
    )
    compared_rule(
        "excess_divergence_rate",
        c,
        summary.excess_divergence_rate <= gate.max_excess_divergence_rate,
        f"divergence rate {c.divergence_rate:.3f} vs A/A {aa.divergence_rate:.3f}, excess "
        f"{summary.excess_divergence_rate:.3f} (max {gate.max_excess_divergence_rate:g})",
    )
    mismatch_ids = ", ".join(c.finish_mismatch_prompt_ids[:20]) + (
        " ..." if len(c.finish_mismatch_prompt_ids) > 20 else ""
    )
    compared_rule(
        "finish_reasons",
        c,
        summary.excess_finish_mismatch <= gate.max_finish_mismatches,
        f"{c.finish_mismatch} prompt(s) with the baseline's tokens but another finish reason vs "
        f"{aa.finish_mismatch} in A/A, excess {summary.excess_finish_mismatch} "
        f"(max {gate.max_finish_mismatches})" + (f": {mismatch_ids}" if mismatch_ids else ""),
    )
    _drift_rule(rule, summary, gate)
    return Verdict(_status(reasons), tuple(reasons))


def _drift_rule(rule: Callable[[str, bool, RuleOutcome, str], None], summary: Summary,
                gate: GateSettings) -> None:  # fmt: skip
    """p99 drift in excess of A/A's. Drift measured at no position at all is not a pass: with
    no position on the A/A pair either, the baseline reports no logprobs to measure against
    (undecided); with A/A positions but none on the candidate, the candidate agreed with the
    baseline on no first token (fail; a candidate leaving out logprobs is a malformed answer,
    counted by candidate_errors before it gets here)."""
    c, aa = summary.candidate, summary.aa
    if c.compared == 0:
        rule("logprob_drift_p99", False, "undecided", "no prompt was compared on every target")
    elif c.drift.count == 0:
        rule(
            "logprob_drift_p99",
            False,
            "fail" if aa.drift.count else "undecided",
            "logprob drift not measured: no position before a first divergence where both the "
            "baseline and the candidate report the chosen token's logprob"
            + (
                f" (A/A: {aa.drift.count})"
                if aa.drift.count
                else "; the baseline reports none against its twin either"
            ),
        )
    else:
        rule(
            "logprob_drift_p99",
            summary.excess_drift_p99 <= gate.max_logprob_drift_p99,
            "fail",
            f"p99 logprob drift {c.drift.p99:.3g} over {c.drift.count} positions vs A/A "
            f"{aa.drift.p99:.3g} nats, excess {summary.excess_drift_p99:.3g} "
            f"(max {gate.max_logprob_drift_p99:g})",
        )


def _status(reasons: list[Reason]) -> VerdictStatus:
    """The precedence of the module docstring."""
    if any(r.outcome == "fail" and r.rule in CANDIDATE_FAULT_RULES for r in reasons):
        return "fail"
    outcomes = {r.outcome for r in reasons}
    return "error" if "undecided" in outcomes else "fail" if "fail" in outcomes else "pass"


def _kinds(errors: dict[str, dict[str, int]], roles: tuple[str, ...]) -> str:
    parts = [f"{role}:{kind}={n}" for role in roles for kind, n in sorted(errors[role].items())]
    return f"({', '.join(parts)})" if parts else ""
