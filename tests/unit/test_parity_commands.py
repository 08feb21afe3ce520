"""kdtree-parity's commands (kdtree_parity/commands/, one module each) and cli.py, which builds
the parser from them and dispatches to the parsed command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kdtree_parity import cli
from kdtree_parity.commands import COMMANDS
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.settings import ParitySettings


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_module_is_a_subcommand_in_order() -> None:
    parser = cli.build_parser(ParitySettings())
    assert list(_subcommands(parser)) == [
        "run", "report", "judge", "list", "corpus", "schema", "policy", "serve",
    ]  # fmt: skip
    assert list(COMMANDS) == list(_subcommands(parser))
    for name, module in COMMANDS.items():
        assert module.HELP and callable(module.add_arguments) and callable(module.run), name


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["report", "r1"],
        ["judge", "r1", "--policy", "short"],
        ["list"],
        ["corpus", "long", "--out", "x.jsonl"],
        ["schema"],
        ["policy", "--show", "default"],
        ["serve"],
    ],
)
def test_the_parsed_command_is_its_module(argv: list[str]) -> None:
    args = cli.build_parser(ParitySettings()).parse_args(argv)
    assert args.command == argv[0]
    assert args.run is COMMANDS[argv[0]].run


def test_options_default_to_the_settings() -> None:
    settings = ParitySettings(db="/tmp/x.sqlite3", port=9999, candidate_image="sha256:c")
    parser = cli.build_parser(settings)
    assert parser.parse_args(["list"]).db == "/tmp/x.sqlite3"
    assert parser.parse_args(["serve"]).port == 9999
    run = parser.parse_args(["run"])
    assert run.candidate_image == "sha256:c" and run.settings is settings
    assert run.baseline is None  # a new run's flags default in the command, not the parser


def test_main_dispatches_schema_and_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schema"]) == ExitCode.PASSED
    assert json.loads(capsys.readouterr().out)["title"] == "Report"
    assert cli.main(["policy", "--show", "short"]) == ExitCode.PASSED
    assert capsys.readouterr().out.startswith("# effective policy of ")


def test_a_refusal_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "--resume", "r1", "--baseline", "http://a:1"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "cannot resume r1 with --baseline" in err
    missing = tmp_path / "none.sqlite3"
    assert cli.main(["list", "--db", str(missing)]) == ExitCode.ERROR
    assert "cannot read the run database" in capsys.readouterr().err
    assert not missing.exists()


def test_an_unknown_command_is_argparses_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["promote"])
    assert exit_info.value.code == 2
