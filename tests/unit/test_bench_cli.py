"""bench/kdtree_bench/cli.py: NAME=PATH arguments and the printed (and written) table that the bench tools
share."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kdtree_bench.analysis import merge_e2e
from kdtree_bench.cli import emit_table, name_and_path
from kdtree_bench.profiling import host_samples


def test_name_and_path_splits_at_the_first_equals_sign() -> None:
    parse = name_and_path("RUN=SPEED_JSON")
    assert parse("run9=/tmp/a=b/speed.json") == ("run9", Path("/tmp/a=b/speed.json"))
    for bad in ("run9", "=speed.json", "run9="):
        with pytest.raises(
            argparse.ArgumentTypeError, match=f"expected RUN=SPEED_JSON, got '{bad}'"
        ):
            parse(bad)


@pytest.mark.parametrize(
    ("main", "form"),
    [
        (host_samples.main, "NAME=PYSPY_RAW_FILE"),
        (merge_e2e.main, "RUN=SPEED_JSON or RUN=SPEED_LOG"),
    ],
)
def test_the_tools_refuse_an_argument_without_its_name(main, form, capsys) -> None:
    args = ["record.json", "speed.json"] if main is merge_e2e.main else ["raw.txt"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert f"expected {form}, got " in capsys.readouterr().err


def test_emit_table_prints_and_writes_the_same_text(tmp_path: Path, capsys) -> None:
    emit_table("| a |\n|---|\n", tmp_path / "t.md")
    assert capsys.readouterr().out == "| a |\n|---|\n" == (tmp_path / "t.md").read_text()
    emit_table("| b |\n", None)
    assert capsys.readouterr().out == "| b |\n"
