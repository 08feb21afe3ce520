"""The resolution section of a report: read from a parity_resolution.py table, the row for this
run's corpus size printed in Markdown and HTML; an unusable table is refused by name."""

from __future__ import annotations

import json

import pytest

from kdtree_parity.cli import main
from kdtree_parity.report.resolution import (
    ResolutionError,
    load_resolution,
    resolution_html,
    resolution_markdown,
    with_resolution_html,
)

TABLE = {
    "policy": {"base": "short", "min_prompts": 12},
    "corpus_sizes": [12, 24],
    "cells": [],
    "resolution": {
        "scale": {
            "12": {"smallest_detected": 0.001, "largest_missed": 0.0001},
            "24": {"smallest_detected": 0.0002, "largest_missed": 0.0001},
        },
        "kv_drop": {
            "12": {"smallest_detected": None, "largest_missed": 16},
            "24": {"smallest_detected": 32, "largest_missed": 48},
        },
    },
}


@pytest.fixture
def table_path(tmp_path):
    path = tmp_path / "resolution.json"
    path.write_text(json.dumps(TABLE))
    return path


def test_the_row_of_the_runs_corpus_size_is_printed(table_path):
    table = load_resolution(table_path)
    md = resolution_markdown(table, prompts=30)
    assert "the 24-prompt row applies" in md
    assert "| scale | scale:0.0002 |" in md
    assert "| kv\\_drop | kv\\_drop:32 |" in md
    small = resolution_markdown(table, prompts=12)
    assert "| scale | scale:0.001 |" in small
    assert "| kv\\_drop | none of the sizes measured |" in small
    assert "resolution is not known" in resolution_markdown(table, prompts=5)


def test_html_section_is_escaped_and_lands_in_the_body(table_path):
    section = resolution_html(load_resolution(table_path), prompts=24)
    assert "<b>scale:0.0002</b>" in section and "<b>kv_drop:32</b>" in section
    page = with_resolution_html("<html><body><p>x</p></body></html>", section)
    assert page.index(section) < page.index("</body>")


def _with(**changes) -> str:
    table = json.loads(json.dumps(TABLE))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = table
        for key in parents:
            node = node[key]
        node[last] = value
    return json.dumps(table)


@pytest.mark.parametrize(
    "content",
    [
        "{",
        "[]",
        json.dumps({"corpus_sizes": [1]}),
        # Before: each of these was read, the whole corpus replayed, and then the report crashed.
        _with(resolution__scale__12__smallest_detected="0.001"),
        _with(resolution__scale__12__smallest_detected=float("nan")),
        _with(corpus_sizes=["12", 24]),
        _with(corpus_sizes=[0, 24]),
        _with(resolution__scale={"twelve": {"smallest_detected": 0.1}}),
    ],
)
def test_unusable_tables_are_refused(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ResolutionError, match=r"not a parity_resolution\.py table"):
        load_resolution(path)
    with pytest.raises(ResolutionError, match=r"missing\.json"):
        load_resolution(tmp_path / "missing.json")


def test_cli_refuses_a_bad_table_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code = main(["report", "r1", "--db", str(tmp_path / "none.sqlite3"), "--resolution", str(bad)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "not a parity_resolution.py table" in err and "\n" not in err
