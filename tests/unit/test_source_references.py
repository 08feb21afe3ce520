"""References written in code (docstrings, comments, error messages) resolve: ``docs/x.md``
names a file, and ``README, "Heading"`` or ``docs/x.md, 'Heading'`` one of that document's
headings, so a message that sends a user somewhere sends them to something; a path in the tree
(``kernel/csrc/verify_kernel.cu``, ``bench/results/h200.json``, ...) names a file that is there,
unless it is where a command writes (``--out PATH``)."""

from __future__ import annotations

import re
from pathlib import Path

from test_doc_links import REPO, anchors, slug

SOURCES = sorted(
    p
    for top in ("kernel", "services", "bench", "scripts", "tests")
    for p in (REPO / top).rglob("*.py")
    if ".venv" not in p.parts
)
DOCUMENT = r"(?P<doc>README(?:\.md)?|docs/[\w.-]+\.md)"
SECTION = re.compile(DOCUMENT + r"(?:,| section)? (?P<q>['\"])(?P<heading>[^'\"\n]{3,80})(?P=q)")
PATH = re.compile(r"(?<![\w/])docs/[\w-]+\.md(?:#[\w-]+)?")
TREE_PATH = re.compile(
    r"(?<![\w/.-])(?:kernel|services|bench|scripts|tests)/[\w./-]*"
    r"\.(?:py|sh|md|cu|cpp|h|json|yaml|yml|txt|toml|jsonl|log|tar\.xz)\b"
)
OUTPUT = re.compile(r"(?:--out[= ]|_OUT=)$")  # what precedes a path a command writes


# These two hold made-up references on purpose (the checks' own cases).
FIXTURES = {Path(__file__).name, "test_doc_links.py"}


def _document(name: str, root: Path) -> Path:
    return root / ("README.md" if name.startswith("README") else name)


def unresolved(text: str, root: Path = REPO) -> list[str]:
    found = []
    for match in PATH.finditer(text):
        path, _, anchor = match.group(0).partition("#")
        if not (root / path).exists():
            found.append(f"{match.group(0)}: no such file")
        elif anchor and anchor not in anchors(root / path):
            found.append(f"{match.group(0)}: no heading #{anchor}")
    for match in TREE_PATH.finditer(text):
        written = OUTPUT.search(text[max(0, match.start() - 8) : match.start()])
        if not written and not (root / match.group(0)).exists():
            found.append(f"{match.group(0)}: no such file")
    for match in SECTION.finditer(text):
        document = _document(match.group("doc"), root)
        heading = match.group("heading")
        if document.exists() and slug(heading) not in anchors(document):
            found.append(f'{match.group("doc")}, "{heading}": no such heading')
    return found


def test_every_reference_in_the_code_resolves() -> None:
    found = [
        f"{path.relative_to(REPO)}: {problem}"
        for path in SOURCES
        if path.name not in FIXTURES
        for problem in unresolved(path.read_text())
    ]
    assert found == []


def test_the_check_catches_a_missing_document_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ops.md").write_text("# Ops\n\n## The container tests\n")
    (tmp_path / "README.md").write_text("# kdtree\n\n## Serve with SGLang\n")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "h200.json").write_text("{}")
    text = (
        "see README, \"The verify op\"; docs/ops.md, 'The container tests'; docs/gone.md;\n"
        "(README, 'Serve with SGLang') docs/ops.md#the-container-tests docs/ops.md#nothing\n"
        "bench/results/h200.json bench/results/h100.json kernel/csrc/gone.cu\n"
        "python bench/x.py --out bench/results/new.json; make bench BENCH_OUT=bench/results/b.json"
    )
    assert unresolved(text, tmp_path) == [
        "docs/gone.md: no such file",
        "docs/ops.md#nothing: no heading #nothing",
        "bench/results/h100.json: no such file",
        "kernel/csrc/gone.cu: no such file",
        "bench/x.py: no such file",
        'README, "The verify op": no such heading',
    ]
