"""``kdtree-parity policy --show P``: a policy as the gate reads it, every key with its value."""

from __future__ import annotations

import argparse
import sys

from kdtree_parity.commands.options import console
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.policy import PolicyError, load_policy, policy_yaml
from kdtree_parity.settings import ParitySettings
from kdtree_parity.untrusted_text import for_terminal

HELP = "print a policy as the gate reads it"


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    parser.add_argument(
        "--show",
        metavar="POLICY",
        required=True,
        help="YAML path or default|short: prints every key with its effective value as YAML",
    )


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_policy(args.show)
    except PolicyError as exc:
        console.print(f"[red]{for_terminal(exc, keep_newlines=True)}", highlight=False)
        return ExitCode.ERROR
    sys.stdout.write(f"# effective policy of {loaded.source} (sha256 {loaded.sha256})\n")
    sys.stdout.write(policy_yaml(loaded.policy))
    return ExitCode.PASSED
