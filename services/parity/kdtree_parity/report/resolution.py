"""The gate's measured resolution as a section of a run's Markdown and HTML reports.

Input: a resolution table (``resolution.json`` as ``bench/parity_resolution.py`` writes it:
graded faults x corpus size -> verdict, and per fault kind and corpus size the smallest fault
that failed). The section names the smallest fault of each kind that this policy detected with
a corpus of this run's size (the largest measured corpus size not above the prompts this run
compared), and the whole per-size summary. Given on the command line (``kdtree-parity run|report
--resolution FILE``); a run without one reports as before.
"""

from __future__ import annotations

import hashlib
import html
import json
from dataclasses import dataclass
from pathlib import Path

# A kv_drop or tree_mask fault is smaller the later its position or row.
LATER_IS_SMALLER = ("kv_drop", "tree_mask")
UNITS = {
    "scale": "relative error of the softmax scale",
    "weight": "relative weight noise in one layer",
    "kv_drop": "position of the one KV row masked out (later = smaller)",
    "tree_mask": "draft-tree row shown one extra node (later = smaller)",
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


def load_resolution(path: str | Path) -> ResolutionTable:
    path = Path(path)
    try:
        data = path.read_bytes()
        table = json.loads(data)
        sizes = [int(k) for k in table["corpus_sizes"]]
        smallest = {
            kind: {int(k): v["smallest_detected"] for k, v in per_size.items()}
            for kind, per_size in table["resolution"].items()
        }
        policy = str(table["policy"]["base"])
    except OSError as exc:
        raise ResolutionError(f"resolution table {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ResolutionError(
            f"resolution table {path}: not a parity_resolution.py table ({type(exc).__name__}: "
            f"{exc})"
        ) from None
    return ResolutionTable(str(path), hashlib.sha256(data).hexdigest(), policy, sizes, smallest)


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
            f"in `{table.path}`: its resolution is not known."
        )
    else:
        lines.append(
            f"Measured by `bench/parity_resolution.py` with policy `{table.policy}` "
            f"(`{table.path}`, sha256 `{table.sha256[:12]}`); this run compared "
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
        lines.append(f"| `{kind}` | {here} | {unit} | " + " | ".join(per_size) + " |")
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
