"""The report's context section: the verdict's rules by context-length bucket, the longest
prompt the run reached against the policy's ``min_context_tokens``, and accept length by target
and bucket (``verdict.py`` computes them; this module only shapes them for the report)."""

from __future__ import annotations

from kdtree_parity.accept_length import AcceptLengths
from kdtree_parity.policy import GateSettings
from kdtree_parity.report.schema import (
    AcceptLengthModel,
    BucketModel,
    ContextModel,
    PairSummaryModel,
    ReasonModel,
)
from kdtree_parity.verdict import Judgement


def _accept(accept: AcceptLengths) -> list[AcceptLengthModel]:
    return [
        AcceptLengthModel(role=role, answers=len(values), mean=accept.mean(role) or 0.0)
        for role, values in accept.by_role.items()
    ]


def _pair(summary: object) -> PairSummaryModel:
    return PairSummaryModel.model_validate(summary, from_attributes=True)


def context_model(judgement: Judgement, gate: GateSettings) -> ContextModel:
    return ContextModel(
        longest_prompt_tokens=judgement.longest_prompt,
        min_context_tokens=gate.min_context_tokens,
        accept_length=_accept(judgement.accept),
        buckets=[
            BucketModel(
                label=b.label,
                prompts=b.prompts,
                min_tokens=b.min_tokens,
                max_tokens=b.max_tokens,
                status=b.reason().outcome,
                candidate=_pair(b.summary.candidate),
                aa=_pair(b.summary.aa),
                floor=None if b.summary.floor is None else _pair(b.summary.floor),
                reasons=[
                    ReasonModel.model_validate(r, from_attributes=True) for r in b.verdict.reasons
                ],
                accept_length=_accept(b.accept),
            )
            for b in judgement.buckets
        ],
    )


def context_markdown(context: ContextModel | None) -> list[str]:
    """A Markdown table of the buckets (empty without a context section)."""
    if context is None or not context.buckets:
        return []
    lines = [
        "",
        f"**Context**: longest prompt {context.longest_prompt_tokens} tokens "
        f"(policy requires {context.min_context_tokens or 'none'})",
        "",
        "| bucket | prompts | tokens | exact | hard | p99 drift | accept length (cand / base) "
        "| rules |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in context.buckets:
        accept = {a.role: a.mean for a in b.accept_length}
        # The baseline, never the floor: a floor may draft another shape (accept_length.py).
        cand, base = accept.get("candidate"), accept.get("baseline")
        al = f"{cand:.2f} / {base:.2f}" if cand is not None and base is not None else "-"
        failed = [r.rule for r in b.reasons if r.outcome == "fail"]
        lines.append(
            f"| {b.label} | {b.prompts} | {b.min_tokens}-{b.max_tokens} | "
            f"{b.candidate.exact}/{b.candidate.compared} | {b.candidate.hard} | "
            f"{b.candidate.drift.p99:.3g} | {al} | "
            f"{'FAIL: ' + ', '.join(failed) if failed else 'pass'} |"
        )
    return lines
