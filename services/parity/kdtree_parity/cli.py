"""``kdtree-parity``: run the gate, render a stored run's report, decide a stored run again under
another policy, list runs, write the long-context corpus, print the report's schema or a policy,
serve the service. Each command is a module of ``kdtree_parity.commands``.

Exit codes of ``run`` (and ``report``, ``judge``): 0 pass, 1 fail, 2 could not decide (the
baseline side failed, too few prompts, an interrupted run, bad input or unusable outputs). The verdict and the
report's path go to stdout; progress, logs and errors to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kdtree_parity.commands import COMMANDS
from kdtree_parity.commands.options import console
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.settings import ParitySettings, SettingsError, load_settings
from kdtree_parity.untrusted_text import for_terminal
from kdtree_parity.version import add_version_flag


def build_parser(settings: ParitySettings | None = None) -> argparse.ArgumentParser:
    """The CLI; its defaults come from ``settings`` (by default: the environment's). Each
    command's parser has ``run``: the command to call with the parsed arguments."""
    settings = load_settings() if settings is None else settings
    parser = argparse.ArgumentParser(
        prog="kdtree-parity",
        description="Replay a corpus against a baseline and a candidate inference server, compare "
        "greedy outputs token by token against A/A noise, and decide by a policy.",
    )
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        parsed = sub.add_parser(name, help=command.HELP)
        command.add_arguments(parsed, settings)
        parsed.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        console.print(
            f"[red]kdtree-parity: {for_terminal(exc, keep_newlines=True)}", highlight=False
        )
        return ExitCode.ERROR
    args = build_parser(settings).parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
