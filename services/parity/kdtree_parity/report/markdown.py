"""Render a Report as a short Markdown summary for CI job pages."""

from __future__ import annotations

from kdtree_parity.report.schema import Report

_ICON = {"pass": "✅", "fail": "❌", "error": "⚠️", "undecided": "⚠️"}


def render_markdown(report: Report, max_prompts: int = 20) -> str:
    s, v = report.summary, report.verdict
    lines = [
        f"## Parity verdict: {_ICON[v.status]} **{v.status.upper()}** (run `{report.run.id}`)",
        "",
        *(
            f"- {_ICON[r.outcome] if r.outcome != 'pass' else '✔'} `{r.rule}`: {r.message}"
            for r in v.reasons
        ),
        "",
        "| | candidate vs baseline | A/A | excess |",
        "|---|---|---|---|",
        f"| prompts compared | {s.candidate.compared} | {s.aa.compared} | |",
        f"| exact-match rate | {s.candidate.exact_rate:.3f} | {s.aa.exact_rate:.3f} | |",
        f"| divergence rate | {s.candidate.divergence_rate:.3f} | {s.aa.divergence_rate:.3f} "
        f"| {s.excess.divergence_rate:.3f} |",
        f"| hard / near-tie | {s.candidate.hard} / {s.candidate.near_tie} "
        f"| {s.aa.hard} / {s.aa.near_tie} | {s.excess.hard} |",
        f"| logprob drift p99 (nats) | {s.candidate.drift.p99:.3g} | {s.aa.drift.p99:.3g} "
        f"| {s.excess.drift_p99:.3g} |",
        f"| drift positions measured | {s.candidate.drift.count} | {s.aa.drift.count} | |",
        f"| same tokens, other finish reason | {s.candidate.finish_mismatch} "
        f"| {s.aa.finish_mismatch} | {s.excess.finish_mismatch} |",
        "",
        "Targets: "
        + ", ".join(f"{t.role} `{t.url}`" for t in report.targets)
        + f". Corpus `{report.corpus.source}` sha256 `{report.corpus.sha256[:16]}…`, "
        f"policy `{report.policy.source}` sha256 `{report.policy.sha256[:16]}…`.",
    ]
    for change in report.identity_changes:
        lines += [
            "",
            f"⚠️ **Resumed against a changed {change.role}** ({change.at}, accepted by override; "
            f"this run holds results of more than one build): {'; '.join(change.differences)}",
        ]
    if report.policy.refused:
        lines += ["", f"⚠️ **Stored policy refused by today's rules**: {report.policy.refused}"]
    for u in s.undecidable_prompts:
        lines += ["", f"⚠️ **Undecidable prompt** `{u.id}` (the baseline rejected it): {u.why}"]
    flagged = [
        p
        for p in report.prompts
        if p.status in ("hard", "error", "near_tie")
        or (p.candidate is not None and p.candidate.finish_a != p.candidate.finish_b)
    ]
    if flagged:
        lines += ["", "| prompt | status | first divergence | reason |", "|---|---|---|---|"]
        for p in flagged[:max_prompts]:
            c = p.candidate
            where = "" if c is None or c.first_divergence is None else str(c.first_divergence)
            why = (c.divergence_reason if c is not None else "") or next(
                (f"{side.role}: {side.error}" for side in p.sides if side.error), ""
            )
            lines.append(f"| `{p.id}` | {p.status} | {where} | {why.replace('|', '/')} |")
        if len(flagged) > max_prompts:
            lines.append(f"| … {len(flagged) - max_prompts} more | | | |")
    return "\n".join(lines) + "\n"
