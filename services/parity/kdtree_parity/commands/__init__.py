"""The ``kdtree-parity`` commands, one module each (``kdtree_parity.cli`` builds the parser from
them and dispatches).

A command module has ``HELP`` (its line in ``kdtree-parity --help``), ``add_arguments(parser,
settings)`` (its options, their defaults from the settings) and ``run(args) -> int`` (its exit
status). What several commands share (consoles, refusals, ``--db``, printing a verdict) is in
``options``. ``python -m kdtree_parity.promote`` is a program of its own (``promote/cli.py``),
wired the same way: each subcommand's parser ``set_defaults(run=...)``.
"""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Protocol

from kdtree_parity.commands import corpus, judge, policy, report, run, schema, serve
from kdtree_parity.commands import list as list_runs
from kdtree_parity.settings import ParitySettings


class Command(Protocol):
    """What a command module provides."""

    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser, settings: ParitySettings) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# Name -> module, in the order `kdtree-parity --help` lists them.
COMMANDS: dict[str, ModuleType] = {
    "run": run,
    "report": report,
    "judge": judge,
    "list": list_runs,
    "corpus": corpus,
    "schema": schema,
    "policy": policy,
    "serve": serve,
}
