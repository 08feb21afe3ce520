"""Render a Report as a short Markdown summary for CI job pages."""

from __future__ import annotations

from kdtree_parity.report.context import context_markdown
from kdtree_parity.report.schema import Report
from kdtree_parity.untrusted_text import for_markdown

_ICON = {"pass": "✅", "fail": "❌", "error": "⚠️", "undecided": "⚠️"}


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _tests_table(report: Report) -> list[str]:
    """Each statistical test: statistic, p-value, level, interval, decision and power."""
    rows = [r for r in report.verdict.reasons if r.test is not None]
    if not rows:
        return []
    out = [
        "| test | method | statistic | p-value | alpha | estimate [interval] | decision | power |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r.test
        assert t is not None
        interval = "" if t.interval is None else f" [{t.interval[0]:.3g}, {t.interval[1]:.3g}]"
        out.append(
            f"| `{t.name}` | {t.method} | {_num(t.statistic)} | {_num(t.p_value)} "
            f"| {t.alpha:.3g} | {_num(t.estimate)}{interval} | {t.decision} | {t.power or ''} |"
        )
    return [*out, ""]


def _floor_table(report: Report) -> list[str]:
    f = report.summary.floor
    if f is None:
        return []
    return [
        "| A/A' noise floor (baseline vs A/A') | value |",
        "|---|---|",
        f"| prompts compared | {f.compared} |",
        f"| divergence rate | {f.divergence_rate:.3f} (hard {f.hard}, near-tie {f.near_tie}) |",
        f"| logprob drift p99 (nats) | {f.drift.p99:.3g} over {f.drift.count} positions |",
        "",
    ]


def _speed_table(report: Report) -> list[str]:
    if not report.summary.speed:
        return []
    out = [
        "| target | requests | median tokens/s (sidecar's clock) | median TTFT (s) "
        "| self-reported decode tokens/s (not used) |",
        "|---|---|---|---|---|",
    ]
    for sp in report.summary.speed:
        out.append(
            f"| {sp.role} | {sp.requests} | {_num(sp.median_decode_tps, '.4g')} "
            f"| {_num(sp.median_ttft_s, '.4g')} | {_num(sp.median_reported_decode_tps, '.4g')} |"
        )
    return [*out, ""]


def render_markdown(report: Report, max_prompts: int = 20) -> str:
    s, v = report.summary, report.verdict
    lines = [
        f"## Parity verdict: {_ICON[v.status]} **{v.status.upper()}** (run `{report.run.id}`)",
        "",
        *(
            f"- {_ICON[r.outcome] if r.outcome != 'pass' else '✔'} `{r.rule}`: "
            f"{for_markdown(r.message)}"
            for r in v.reasons
        ),
        "",
        *_tests_table(report),
        *_floor_table(report),
        *_speed_table(report),
        *context_markdown(report.context),
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
        + ", ".join(f"{t.role} {for_markdown(t.url)}" for t in report.targets)
        + f". Corpus {for_markdown(report.corpus.source)} sha256 `{report.corpus.sha256[:16]}…`, "
        f"policy {for_markdown(report.policy.source)} sha256 `{report.policy.sha256[:16]}…`.",
    ]
    for change in report.identity_changes:
        lines += [
            "",
            f"⚠️ **Resumed against a changed {change.role}** ({change.at}, accepted by override; "
            f"this run holds results of more than one build): "
            f"{for_markdown('; '.join(change.differences))}",
        ]
    if report.policy.refused:
        lines += [
            "",
            f"⚠️ **Stored policy refused by today's rules**: {for_markdown(report.policy.refused)}",
        ]
    for u in s.undecidable_prompts:
        lines += [
            "",
            f"⚠️ **Undecidable prompt** {for_markdown(u.id)} (the baseline rejected it): "
            f"{for_markdown(u.why)}",
        ]
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
            lines.append(f"| {for_markdown(p.id)} | {p.status} | {where} | {for_markdown(why)} |")
        if len(flagged) > max_prompts:
            lines.append(f"| … {len(flagged) - max_prompts} more | | | |")
    return "\n".join(lines) + "\n"
