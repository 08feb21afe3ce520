"""``kdtree-parity schema``: the JSON Schema of report.json."""

from __future__ import annotations

import argparse
import json
import sys

from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.report.schema import Report
from kdtree_parity.settings import ParitySettings

HELP = "print the JSON Schema of report.json"


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    """No options."""


def run(_: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(Report.model_json_schema(), indent=1) + "\n")
    return ExitCode.PASSED
