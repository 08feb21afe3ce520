"""Render a Report as one self-contained HTML page (inline CSS and SVG, no scripts, no fetches)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jinja2

from kdtree_parity.report.schema import PromptModel, Report, SideModel
from kdtree_parity.untrusted_text import for_html

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("kdtree_parity.report", "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=for_html,  # no bidi or other invisible control from a target reaches the page
)
# Order in which prompts are listed: what a reviewer must look at first.
_STATUS_ORDER = {"hard": 0, "error": 1, "near_tie": 2, "exact": 3}
CHART_W, CHART_H, CHART_PAD = 720, 180, 28


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    css: str
    title: str


@dataclass(frozen=True)
class Token:
    text: str
    title: str
    css: str


def token_label(text: str | None, token_id: int) -> str:
    """A token as a reader should see it: whitespace made visible, unknown text as its id."""
    if text is None or text == "":
        return f"⟨{token_id}⟩"
    return text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")


def token_view(side: SideModel, divergence: int | None) -> list[Token]:
    out = []
    for i, token_id in enumerate(side.output_ids):
        text = side.token_texts[i] if i < len(side.token_texts) else None
        lp = side.token_logprobs[i] if i < len(side.token_logprobs) else None
        css = "tok"
        if divergence is not None:
            css += " div" if i == divergence else " after" if i > divergence else ""
        title = f"#{i} id {token_id}" + ("" if lp is None else f" logprob {lp:.4f}")
        out.append(Token(token_label(text, token_id), title, css))
    return out


def divergence_chart(report: Report) -> tuple[list[Bar], list[tuple[float, str]], int]:
    """Histogram bars of first-divergence positions: candidate hard / near-tie, and A/A."""
    series: dict[str, list[int]] = {"hard": [], "near_tie": [], "aa": []}
    for p in report.prompts:
        if p.candidate is not None and p.candidate.first_divergence is not None:
            series[p.candidate.divergence_class or "hard"].append(p.candidate.first_divergence)
        if p.aa is not None and p.aa.first_divergence is not None:
            series["aa"].append(p.aa.first_divergence)
    positions = [x for xs in series.values() for x in xs]
    top = max(positions, default=0) + 1
    bins = min(32, top)
    width = math.ceil(top / bins)
    counts = {k: [0] * bins for k in series}
    for key, xs in series.items():
        for x in xs:
            counts[key][min(x // width, bins - 1)] += 1
    peak = max(
        [counts["hard"][b] + counts["near_tie"][b] for b in range(bins)] + counts["aa"] + [1]
    )
    slot = (CHART_W - 2 * CHART_PAD) / bins
    scale = (CHART_H - 2 * CHART_PAD) / peak
    base = CHART_H - CHART_PAD
    bars: list[Bar] = []
    for b in range(bins):
        x0 = CHART_PAD + b * slot
        label = f"positions {b * width}-{(b + 1) * width - 1}"
        y = base
        for key in ("hard", "near_tie"):
            n = counts[key][b]
            if n:
                h = n * scale
                y -= h
                bars.append(Bar(x0 + 1, y, slot * 0.6 - 1, h, key, f"{label}: {n} {key}"))
        n = counts["aa"][b]
        if n:
            h = n * scale
            bars.append(Bar(x0 + slot * 0.6, base - h, slot * 0.35, h, "aa", f"{label}: {n} A/A"))
    ticks = [(CHART_PAD + b * slot, str(b * width)) for b in range(0, bins, max(1, bins // 8))]
    return bars, ticks, peak


def render_html(report: Report) -> str:
    prompts: list[PromptModel] = sorted(
        report.prompts, key=lambda p: (_STATUS_ORDER[p.status], p.line)
    )
    views = {}
    for p in prompts:
        at = p.candidate.first_divergence if p.candidate is not None else None
        views[p.id] = {s.role: token_view(s, at) for s in p.sides}
    bars, ticks, peak = divergence_chart(report)
    return _ENV.get_template("report.html.j2").render(
        r=report,
        s=report.summary,
        prompts=prompts,
        views=views,
        bars=bars,
        ticks=ticks,
        peak=peak,
        chart={"w": CHART_W, "h": CHART_H, "pad": CHART_PAD},
        token_label=token_label,
    )
