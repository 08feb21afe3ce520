"""The index of bench/results, generated from the records themselves: ``bench/results/INDEX.md``.

One section per record: every file directly under ``bench/results/`` and every run folder
(``gpu_run*``, ``sglang_e2e/run*``, ``parity_resolution``). Each says what the record measured,
read from its own contents (a JSON's device, shapes, runs, cells; an archive's member count), the
run and commit that ``docs/kernel-journal.md`` gives it where it has a row there, and which of
today's documents (README.md, bench/README.md, docs/*.md but the journal) cite it. The
hand-written guide to the records stays ``bench/results/README.md``.

Usage: python -m kdtree_bench.analysis.results_index [--check]
(writes bench/results/INDEX.md; with --check, exits 1 when the committed index is stale)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "bench" / "results"
INDEX = "INDEX.md"
HAND_WRITTEN = ("README.md", INDEX)
JOURNAL = Path("docs") / "kernel-journal.md"
# A journal row: | label | [**in tree**] `folder` ... | what ran | what it showed | `commit` |
JOURNAL_ROW = re.compile(r"^\| (?P<label>[^|]+?) \| (?:\*\*in tree\*\* )?`(?P<folder>[\w/.-]+)`")
COMMIT = re.compile(r"`([0-9a-f]{7,40})` \|\s*$")


def citing_documents(repo: Path) -> list[Path]:
    """Today's documents: the READMEs and docs/*.md, less the journal (it cites every run)."""
    docs = [repo / "README.md", repo / "bench" / "README.md", *sorted((repo / "docs").glob("*.md"))]
    return [d for d in docs if d.is_file() and d.relative_to(repo) != JOURNAL]


def citation_pattern(record: str) -> re.Pattern[str]:
    """How a document names a record: its path under bench/results (or a run's ``e2e N``)."""
    run = re.fullmatch(r"sglang_e2e/run(\d+)", record)
    if run:
        return re.compile(rf"sglang_e2e/run{run.group(1)}\b|\be2e {run.group(1)}\b")
    return re.compile(rf"(?<![\w/.-])(?:bench/results/)?{re.escape(record)}(?![\w-])")


def cited_by(record: str, documents: list[Path], repo: Path) -> list[str]:
    pattern = citation_pattern(record)
    return [d.relative_to(repo).as_posix() for d in documents if pattern.search(d.read_text())]


def journal_runs(repo: Path) -> dict[str, tuple[str, str | None]]:
    """Folder -> (the journal's label for its run, the commit that row names)."""
    runs: dict[str, tuple[str, str | None]] = {}
    journal = repo / JOURNAL
    if not journal.is_file():
        return runs
    for line in journal.read_text().splitlines():
        row = JOURNAL_ROW.match(line)
        if row:
            commit = COMMIT.search(line)
            runs[row.group("folder")] = (row.group("label"), commit.group(1) if commit else None)
    return runs


def records(results: Path) -> list[str]:
    """Every record: the files directly under results/ and the run folders, in path order."""
    found = [p.name for p in results.iterdir() if p.is_file() and p.name not in HAND_WRITTEN]
    found += [p.name for p in results.iterdir() if p.is_dir() and p.name != "sglang_e2e"]
    e2e = results / "sglang_e2e"
    if e2e.is_dir():
        found += [f"sglang_e2e/{p.name}" for p in e2e.iterdir() if p.is_dir()]
    return sorted(found, key=_natural)


def _natural(path: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def describe_json(data: Any) -> str:
    """What a JSON record measured, from its own keys."""
    if not isinstance(data, dict):
        return "JSON"
    device = f" on {data['device'].split(',')[0]}" if isinstance(data.get("device"), str) else ""
    if "timing" in data and "records" in data:  # kernel_bench
        kv = f", {data['kv_dtype']} KV" if data.get("kv_dtype") else ""
        done = "complete" if data.get("complete") else "incomplete"
        return f"kernel benchmark: {len(data['records'])} shapes{kv} ({done}){device}"
    if "layers_per_forward" in data:
        met = "every point meets" if data.get("all_meet_target") else "not every point meets"
        return f"layer benchmark: {len(data['records'])} points, {met} its target{device}"
    if "cells" in data and "corpus_sizes" in data:
        done = "complete" if data.get("complete") else "cut short"
        return (
            f"parity resolution: {len(data['cells'])} cells, corpus sizes "
            f"{data['corpus_sizes']}, {data.get('servers', '?')} servers ({done})"
        )
    if "runs" in data and "records" in data:  # sglang_e2e's merged record
        runs = ", ".join(sorted(data["runs"], key=_natural))
        return f"real SGLang servers' decode speed: {len(data['records'])} rows from {runs}{device}"
    if "kernels" in data and "nvcc" in data:
        return f"ptxas per kernel and arch: {len(data['kernels'])} entries, nvcc {data['nvcc']}"
    if isinstance(data.get("what"), str):
        return " ".join(data["what"].split()).rstrip(".") + device
    return "JSON: " + ", ".join(list(data)[:6])


def describe_file(path: Path) -> str:
    name = path.name
    if name.endswith(".json"):
        return describe_json(json.loads(path.read_text()))
    if name.endswith((".tar.xz", ".tgz", ".tar.gz")):
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
        return f"archive of {len(members)} files"
    if name == "command.sh":
        return "the device command"
    if name.endswith(".sh"):
        return "shell script"
    if name.endswith(".log"):
        return "raw log"
    if name.endswith(".md"):
        return "tables"
    return "file"


def section(record: str, results: Path, documents: list[Path], runs: dict, repo: Path) -> str:
    path = results / record
    lines = [f"## `{record}`", ""]
    if path.is_file():
        lines.append(f"- measured: {describe_file(path)}")
    else:
        for member in sorted(p for p in path.rglob("*") if p.is_file()):
            lines.append(f"- `{member.relative_to(path).as_posix()}`: {describe_file(member)}")
    if record in runs:
        label, commit = runs[record]
        at = f", commit `{commit}`" if commit else ""
        lines.append(f"- run: {label.strip()} in docs/kernel-journal.md{at}")
    citing = cited_by(record, documents, repo)
    lines.append(f"- cited by: {', '.join(citing) if citing else 'no current document'}")
    naming = named_by(record, results)
    if naming:
        lines.append(f"- its files are named by: {', '.join(naming)}")
    return "\n".join(lines)


def named_by(record: str, results: Path) -> list[str]:
    """The top-level JSON records that name a file of this run folder (e.g. a row's log)."""
    if not record.startswith("sglang_e2e/"):
        return []
    needle = f'"{record.removeprefix("sglang_e2e/")}/'
    return [p.name for p in sorted(results.glob("*.json")) if needle in p.read_text()]


def render(results: Path = RESULTS, repo: Path = REPO) -> str:
    documents = citing_documents(repo)
    runs = journal_runs(repo)
    head = (
        "# bench/results index\n\n"
        "Generated by `python -m kdtree_bench.analysis.results_index` from the records "
        "themselves (do not edit; `tests/unit/test_results_index.py` checks it is current). "
        "What each record is for, in words: [README.md](README.md).\n"
    )
    body = [section(r, results, documents, runs, repo) for r in records(results)]
    return head + "\n" + "\n\n".join(body) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the index is stale")
    args = parser.parse_args(argv)
    fresh = render()
    index = RESULTS / INDEX
    if args.check:
        stale = not index.is_file() or index.read_text() != fresh
        if stale:
            print(f"{index} is stale: run python -m kdtree_bench.analysis.results_index")
        return int(stale)
    index.write_text(fresh)
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
