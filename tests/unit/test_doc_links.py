"""Every relative link in the user-facing documents names a file or folder in the tree, and every
``#anchor`` into a Markdown file names one of its headings (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        REPO / "README.md",
        REPO / "bench" / "README.md",
        REPO / "bench" / "results" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The link targets of Markdown text, outside code blocks and code spans."""
    return LINK.findall(CODE.sub("", FENCE.sub("", text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m) for m in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M)}


def broken(document: Path, root: Path = REPO) -> list[str]:
    found = []
    for target in links(document.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists():
            found.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            found.append(f"{target}: no heading #{anchor}")
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(document: Path) -> None:
    assert document.exists()
    assert broken(document) == []


def test_the_check_catches_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    assert slug("The `kdtree-serve` launcher (SGLang)") == "the-kdtree-serve-launcher-sglang"
    assert links("[a](x.md) `[b](y.md)` [c](https://e.org)\n```\n[d](z.md)\n```\n") == [
        "x.md",
        "https://e.org",
    ]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "kernel.md").write_text("# Kernel\n\n## What each step bought\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[gone](no-such-page.md) [bad](kernel.md#no-such-heading) [ok](kernel.md#what-each-step-bought)"
        " [up](../docs/kernel.md) [self](#title)\n\n# Title\n"
    )
    assert broken(page, tmp_path) == [
        "no-such-page.md: no such file",
        "kernel.md#no-such-heading: no heading #no-such-heading",
    ]


RESULTS = REPO / "bench" / "results"
# A run folder (with or without the bench/results/ prefix) or a file directly named under
# bench/results/, in a code span; `<commit>:bench/results/...` (git history) and placeholders
# such as `layer_<gpu>.json` are not paths in the tree.
RESULT_PATH = re.compile(
    r"(?<![\w:/<-])(?:bench/results/)?((?:gpu_run\d+_\w+|sglang_e2e/run\d+)(?:/[\w./-]*)?)"
    r"|(?<![\w:/<-])bench/results/([\w-]+\.\w+)(?![\w<])"
)
JOURNAL_ROW = re.compile(r"^\| [^|]+ \| (\*\*in tree\*\* )?`([\w/.-]+)`( \(not kept\))?", re.M)


def missing_results(document: Path, results: Path = RESULTS) -> list[str]:
    """The bench/results paths a document names in code spans that are not in the tree."""
    spans = CODE.findall(FENCE.sub("", document.read_text()))
    found = []
    for span in spans:
        for match in RESULT_PATH.finditer(span):
            name = (match.group(1) or match.group(2)).rstrip(".")
            if not (results / name).exists():
                found.append(name)
    return found


def journal_mismatches(journal: Path, results: Path = RESULTS) -> list[str]:
    """Journal rows marked **in tree** whose folder is gone, or (not kept) whose folder is there."""
    found = []
    for in_tree, folder, not_kept in JOURNAL_ROW.findall(journal.read_text()):
        there = (results / folder).exists()
        if in_tree and not there:
            found.append(f"{folder}: marked in tree, not in bench/results")
        elif not_kept and there:
            found.append(f"{folder}: marked not kept, still in bench/results")
    return found


@pytest.mark.parametrize(
    "document",
    [d for d in DOCUMENTS if d.name != "kernel-journal.md"],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_results_a_document_names_are_in_the_tree(document: Path) -> None:
    assert missing_results(document) == []


def test_the_journal_marks_what_is_in_the_tree() -> None:
    journal = REPO / "docs" / "kernel-journal.md"
    assert len(JOURNAL_ROW.findall(journal.read_text())) > 80
    assert journal_mismatches(journal) == []


def test_the_results_checks_catch_a_removed_folder(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    (results / "gpu_run2_kept").mkdir(parents=True)
    (results / "gpu_run2_kept" / "a.log").write_text("")
    (results / "h200.json").write_text("{}")
    page = tmp_path / "page.md"
    page.write_text(
        "`gpu_run2_kept/a.log` `bench/results/gpu_run1_gone/` (`gpu_run2_kept/b.log`)"
        " `bench/results/h200.json` `bench/results/old.json` `git show abc1234:bench/results/x.json`"
        " `bench/results/layer_<gpu>.json` `OUT=bench/results/gpu_runN_<what>`\n"
        "```\nmake bench BENCH_OUT=bench/results/mygpu.json\n```\n"
    )
    assert missing_results(page, results) == ["gpu_run1_gone/", "gpu_run2_kept/b.log", "old.json"]
    journal = tmp_path / "journal.md"
    journal.write_text(
        "| run | folder |\n|---|---|\n| 1 | **in tree** `gpu_run1_gone` | x |\n"
        "| 2 | `gpu_run2_kept` (not kept) | x |\n| 3 | **in tree** `gpu_run2_kept` | x |\n"
        "| 4 | `gpu_run4_old` (not kept) | x |\n"
    )
    assert journal_mismatches(journal, results) == [
        "gpu_run1_gone: marked in tree, not in bench/results",
        "gpu_run2_kept: marked not kept, still in bench/results",
    ]
