"""The gate's measured resolution as a section of a run's Markdown and HTML reports.

Input: a resolution table (``resolution.json`` as ``bench/kdtree_bench/e2e/parity_resolution.py`` writes it:
graded faults x corpus size -> verdict, and per fault kind and corpus size the smallest fault
that failed). The section names the smallest fault of each kind that this policy detected with
a corpus of this run's size (the largest measured corpus size not above the prompts this run
compared), and the whole per-size summary. Given on the command line (``kdtree-parity run|report
--resolution FILE``); a run without one reports as before.
"""

from __future__ import annotations

import hashlib
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kdtree_parity.untrusted_text import for_markdown

# A kv_drop or tree_mask fault is smaller the later its position or row.
LATER_IS_SMALLER = ("kv_drop", "tree_mask")
UNITS = {
    "scale": "relative error of the softmax scale",
    "weight": "relative weight noise in one layer",
    "kv_drop": "position of the one KV row masked out (later = smaller)",
    "tree_mask": "draft-tree row shown one extra node (later = smaller)",
    "layer_scale": "relative scale error of one layer's attention output",
}


class ResolutionError(ValueError):
    """A resolution table file that cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class ResolutionTable:
    path: str
    sha256: str
    policy: str
    corpus_sizes: list[int]
    # kind -> corpus size -> smallest detected size (None: no size of that kind failed)
    smallest: dict[str, dict[int, float | None]]

    def for_prompts(self, prompts: int | None) -> int | None:
        """The measured corpus size that applies to a run comparing ``prompts`` prompts."""
        sizes = [k for k in self.corpus_sizes if prompts is None or k <= prompts]
        return max(sizes) if sizes else None


class _Size(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False)
    smallest_detected: float | None


class _Policy(BaseModel):
    model_config = ConfigDict(strict=True)
    base: str


class _Table(BaseModel):
    """The part of ``resolution.json`` a report reads; strict: a count is an int, a size a
    finite number (or null), so a malformed table is refused before any run starts."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
    corpus_sizes: list[Annotated[int, Field(ge=1)]]
    policy: _Policy
    resolution: dict[str, dict[str, _Size]]


def load_resolution(path: str | Path) -> ResolutionTable:
    path = Path(path)
    try:
        data = path.read_bytes()
        table = _Table.model_validate_json(data)
        smallest = {
            kind: {int(k): v.smallest_detected for k, v in per_size.items()}
            for kind, per_size in table.resolution.items()
        }
    except OSError as exc:
        raise ResolutionError(f"resolution table {path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ResolutionError(
            f"resolution table {path}: not a parity_resolution.py table ({where}: "
            f"{first['msg']}; {exc.error_count()} problem(s))"
        ) from None
    except ValueError as exc:  # a corpus size key that is not a number
        raise ResolutionError(
            f"resolution table {path}: not a parity_resolution.py table ({exc})"
        ) from None
    return ResolutionTable(
        str(path),
        hashlib.sha256(data).hexdigest(),
        table.policy.base,
        list(table.corpus_sizes),
        smallest,
    )


def _value(kind: str, size: float | None) -> str:
    if size is None:
        return "none of the sizes measured"
    return f"{kind}:{int(size)}" if kind in LATER_IS_SMALLER else f"{kind}:{size:g}"


def resolution_rows(table: ResolutionTable, prompts: int | None) -> tuple[int | None, list]:
    applies = table.for_prompts(prompts)
    rows = []
    for kind, per_size in sorted(table.smallest.items()):
        here = per_size.get(applies) if applies is not None else None
        rows.append(
            (
                kind,
                _value(kind, here),
                UNITS.get(kind, ""),
                [_value(kind, per_size.get(k)) for k in table.corpus_sizes],
            )
        )
    return applies, rows


def resolution_markdown(table: ResolutionTable, prompts: int | None) -> str:
    applies, rows = resolution_rows(table, prompts)
    lines = ["", "## Resolution (smallest fault detected)", ""]
    if applies is None:
        lines.append(
            f"This run compared {prompts} prompts, fewer than any corpus size measured "
            f"in {for_markdown(table.path)}: its resolution is not known."
        )
    else:
        lines.append(
            f"Measured by `bench/kdtree_bench/e2e/parity_resolution.py` with policy {for_markdown(table.policy)} "
            f"({for_markdown(table.path)}, sha256 `{table.sha256[:12]}`); this run compared "
            f"{prompts} prompts, so the {applies}-prompt row applies."
        )
    lines += [
        "",
        "| fault | smallest detected here | meaning | "
        + " | ".join(f"{k} prompts" for k in table.corpus_sizes)
        + " |",
        "|---|---|---|" + "---|" * len(table.corpus_sizes),
    ]
    for kind, here, unit, per_size in rows:
        cells = [for_markdown(kind), for_markdown(here), unit, *map(for_markdown, per_size)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def resolution_html(table: ResolutionTable, prompts: int | None) -> str:
    applies, rows = resolution_rows(table, prompts)
    e = html.escape
    head = "".join(f"<th>{k} prompts</th>" for k in table.corpus_sizes)
    body = "".join(
        f"<tr><td><code>{e(kind)}</code></td><td><b>{e(here)}</b></td><td>{e(unit)}</td>"
        + "".join(f"<td>{e(v)}</td>" for v in per_size)
        + "</tr>"
        for kind, here, unit, per_size in rows
    )
    note = (
        f"this run compared {prompts} prompts; the {applies}-prompt row applies"
        if applies is not None
        else f"this run compared {prompts} prompts, fewer than any size measured"
    )
    return (
        '<section id="resolution"><h2>Resolution (smallest fault detected)</h2>'
        f"<p>Policy <code>{e(table.policy)}</code>, table <code>{e(table.path)}</code> "
        f"(sha256 {e(table.sha256[:12])}): {e(note)}.</p>"
        f"<table><tr><th>fault</th><th>smallest detected here</th><th>meaning</th>{head}</tr>"
        f"{body}</table></section>"
    )


def with_resolution_html(page: str, section: str) -> str:
    """``page`` (the report's HTML) with ``section`` as the last thing in its body."""
    at = page.rfind("</body>")
    return page + section if at < 0 else page[:at] + section + page[at:]
