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
