"""The whole verdict of a run: the gate's rules (``gate.decide``) over every prompt, then the
same rules in every context-length bucket, the context the corpus reached, and accept length.

``gate.decide`` judges the run as a whole; a fault only past some thousands of tokens of prefix
would be diluted there by the short prompts, so every bucket is judged on its own as well (all
of decide's rules, ``min_prompts`` aside, at ``alpha`` split over the buckets), and a bucket
that fails a rule fails the run (rule ``bucket <label>``). A rule a bucket cannot judge (too
few prompts to measure) is named in the bucket's reason and decides nothing there: the run as a
whole judged it already. The bucket rules are added only when the run has two buckets or more.

``context_coverage``: the policy's ``min_context_tokens`` against the longest prompt the targets
measured; short of it the run is undecided (the gate never looked where the kernel matters).
``accept_length``: see ``accept_length.py``.

The status keeps ``gate.decide``'s precedence: a candidate fault fails; else anything undecided
is an error; else any failed rule fails; else pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kdtree_parity.accept_length import AcceptLengths, accept_length_reason
from kdtree_parity.buckets import BUCKETS, by_bucket, longest_prompt, prompt_tokens
from kdtree_parity.gate import (
    Reason,
    Summary,
    Verdict,
    decide,
    summarize,
    verdict_status,
)
from kdtree_parity.policy import GateSettings
from kdtree_parity.results import PromptResult

COVERAGE_RULE = "context_coverage"
BUCKET_RULE_PREFIX = "bucket "
# Rules of decide() that say nothing about a bucket: the run as a whole is judged on them.
_RUN_WIDE_RULES = frozenset({"complete", "min_prompts", "reference_targets"})


@dataclass(frozen=True)
class BucketJudgement:
    """One context-length bucket: its prompts, the range of their lengths, and decide()'s
    verdict over them alone."""

    label: str
    prompts: int
    min_tokens: int | None
    max_tokens: int | None
    summary: Summary
    verdict: Verdict
    accept: AcceptLengths

    def reason(self) -> Reason:
        failed = [r for r in self.verdict.reasons if r.outcome == "fail"]
        unjudged = [r.rule for r in self.verdict.reasons if r.outcome == "undecided"]
        span = (
            f"{self.min_tokens}-{self.max_tokens} tokens"
            if self.min_tokens is not None
            else "length not measured"
        )
        message = f"{self.prompts} prompt(s), {span}: " + (
            "; ".join(f"{r.rule} FAIL: {r.message}" for r in failed)
            if failed
            else "every rule passes"
        )
        if unjudged:
            message += f" (not judged in this bucket: {', '.join(unjudged)})"
        return Reason(BUCKET_RULE_PREFIX + self.label, "fail" if failed else "pass", message)


@dataclass(frozen=True)
class Judgement:
    """The verdict, and what it was computed from."""

    verdict: Verdict
    summary: Summary
    buckets: tuple[BucketJudgement, ...]
    longest_prompt: int | None
    accept: AcceptLengths


def judge_buckets(
    results: Sequence[PromptResult], gate: GateSettings
) -> tuple[BucketJudgement, ...]:
    """decide() over each bucket's prompts on its own (min_prompts 1, alpha split)."""
    groups = by_bucket(results)
    bucket_gate = gate.model_copy(
        update={"min_prompts": 1, "alpha": gate.alpha / max(1, len(groups))}
    )
    judged = []
    for label, group in groups.items():
        lengths = [n for r in group if (n := prompt_tokens(r)) is not None]
        summary = summarize(group, len(group))
        verdict = decide(summary, bucket_gate)
        reasons = [r for r in verdict.reasons if r.rule not in _RUN_WIDE_RULES]
        reasons.append(accept_length_reason(group, gate))
        judged.append(
            BucketJudgement(
                label=label,
                prompts=len(group),
                min_tokens=min(lengths) if lengths else None,
                max_tokens=max(lengths) if lengths else None,
                summary=summary,
                verdict=Verdict(verdict.status, tuple(reasons)),
                accept=AcceptLengths.of(group),
            )
        )
    return tuple(judged)


def coverage_reason(longest: int | None, gate: GateSettings) -> Reason:
    need = gate.min_context_tokens
    measured = "no prompt length measured" if longest is None else f"longest prompt {longest}"
    if need == 0:
        return Reason(COVERAGE_RULE, "pass", f"{measured} tokens; the policy requires none")
    ok = longest is not None and longest >= need
    return Reason(
        COVERAGE_RULE,
        "pass" if ok else "undecided",
        f"{measured} tokens, the policy requires {need} (min_context_tokens)"
        + (
            ""
            if ok
            else f": the corpus does not reach the context the gate must cover "
            f"(the long corpus does: {', '.join(label for label, _ in BUCKETS[1:])})"
        ),
    )


def judge(
    results: Sequence[PromptResult],
    prompts_total: int,
    gate: GateSettings,
    *,
    aborted_because: str | None = None,
    candidate_refused: str | None = None,
    reference_problems: Sequence[str] = (),
) -> Judgement:
    """The whole verdict of a run's ``results`` under ``gate`` (see the module docstring)."""
    summary = summarize(results, prompts_total)
    overall = decide(
        summary,
        gate,
        aborted_because=aborted_because,
        candidate_refused=candidate_refused,
        reference_problems=reference_problems,
    )
    answered = [r for r in results if not r.has_error]
    buckets = judge_buckets(answered, gate)
    longest = longest_prompt(answered)
    extra = [coverage_reason(longest, gate), accept_length_reason(answered, gate)]
    if len(buckets) > 1:
        extra += [bucket.reason() for bucket in buckets]
    reasons = (*overall.reasons, *extra)
    return Judgement(
        verdict=Verdict(verdict_status(reasons), reasons),
        summary=summary,
        buckets=buckets,
        longest_prompt=longest,
        accept=AcceptLengths.of(answered),
    )
