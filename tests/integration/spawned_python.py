"""Run a Python script in a fresh interpreter and read back the JSON it prints as ``RESULT ...``:
how the plugin tests see SGLang's processes from outside, with no kdtree or SGLang setting
inherited from the test's own environment."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without ``KDTREE_*`` and ``SGLANG_*``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KDTREE_", "SGLANG_"))}
    env.update(extra)
    return env


def run_for_result(script: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """``python script args...`` in ``script``'s folder; its ``RESULT`` line, parsed."""
    run = subprocess.run(
        [sys.executable, str(script), *args],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=script.parent,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith(RESULT_PREFIX))
    return json.loads(line[len(RESULT_PREFIX) :])
