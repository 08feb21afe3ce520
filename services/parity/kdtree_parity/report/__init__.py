"""Reports of a run: JSON (schema in ``schema.py``), self-contained HTML, Markdown summary."""

from __future__ import annotations

import json
from pathlib import Path

from kdtree_parity.report.build import RunEnding, build_report
from kdtree_parity.report.html import render_html
from kdtree_parity.report.markdown import render_markdown
from kdtree_parity.report.resolution import (
    ResolutionTable,
    resolution_html,
    resolution_markdown,
    with_resolution_html,
)
from kdtree_parity.report.schema import SCHEMA_VERSION, Report
from kdtree_parity.store import Store

__all__ = [
    "SCHEMA_VERSION",
    "Report",
    "RunEnding",
    "build_report",
    "render_html",
    "render_markdown",
    "render_with_resolution",
    "report_json",
    "write_report_files",
]


def report_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=1, allow_nan=False) + "\n"


def render_with_resolution(
    report: Report, fmt: str, resolution: ResolutionTable | None = None
) -> str:
    """The report as ``fmt`` (json, html, md), the resolution section added to html and md."""
    if fmt == "json":
        return report_json(report)
    prompts = report.summary.prompts_compared
    if fmt == "html":
        page = render_html(report)
        return (
            page
            if resolution is None
            else with_resolution_html(page, resolution_html(resolution, prompts))
        )
    text = render_markdown(report)
    return text if resolution is None else text + resolution_markdown(resolution, prompts)


def write_report_files(
    store: Store,
    run_id: str,
    out_dir: Path,
    ending: RunEnding | None = None,
    resolution: ResolutionTable | None = None,
) -> dict[str, Path]:
    """Write report.json, report.html and report.md under ``out_dir/run_id``; return the paths.

    Each file is written to a temporary name and renamed, so a reader never sees half a report.
    ``ending``: see ``build_report``; ``resolution``: the gate's measured resolution, printed in
    the HTML and Markdown (``report/resolution.py``).
    """
    report = build_report(store, run_id, ending)
    target = out_dir / run_id
    target.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": target / "report.json",
        "html": target / "report.html",
        "md": target / "report.md",
    }
    contents = {key: render_with_resolution(report, key, resolution) for key in paths}
    for key, path in paths.items():
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            tmp.write_text(contents[key], encoding="utf-8")
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk must not stay full of half a report
            raise
    return paths
