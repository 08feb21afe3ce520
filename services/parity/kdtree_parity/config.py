"""Environment configuration of the CLI and the service: every variable, its default, its meaning.

README's Configuration table lists the same variables; ``kdtree-parity`` flags override them.
"""

from __future__ import annotations

import os

PREFIX = "KDTREE_PARITY_"

# name (without the prefix) -> (default, meaning)
VARIABLES: dict[str, tuple[str, str]] = {
    "BASELINE_URL": ("http://127.0.0.1:30000", "baseline inference server"),
    "CANDIDATE_URL": ("http://127.0.0.1:30001", "candidate inference server"),
    "REPLICA_URL": ("", "optional second baseline for A/A noise (else the baseline twice)"),
    "BASELINE_IMAGE": ("", "image digest/reference of the baseline, recorded in the report"),
    "CANDIDATE_IMAGE": ("", "image digest/reference of the candidate, recorded in the report"),
    "REPLICA_IMAGE": ("", "image digest/reference of the replica, recorded in the report"),
    "FLOOR_URL": (
        "",
        "optional A/A' target: the baseline computed an equivalent, not "
        "bit-identical way; the candidate is judged by its excess over it",
    ),
    "FLOOR_IMAGE": ("", "image digest/reference of the A/A' target, recorded in the report"),
    "CORPUS": ("default", "corpus: a JSONL path or a shipped name (default, short)"),
    "POLICY": ("default", "policy: a YAML path or a shipped name (default, short)"),
    "DB": ("runs/parity.sqlite3", "SQLite database of runs"),
    "OUT": ("runs/parity", "reports are written to OUT/RUN_ID/report.{json,html,md}"),
    "LEASE_S": ("60", "seconds a run stays claimed by its process without a heartbeat"),
    "TOKEN": ("", "service: bearer token for POST /runs (unset: mutating endpoints refuse)"),
    "HOST": ("127.0.0.1", "service: bind address"),
    "PORT": ("8300", "service: port"),
}


def env_default(name: str, environ: dict[str, str] | None = None) -> str:
    """``KDTREE_PARITY_<name>`` from the environment, else the documented default."""
    env = os.environ if environ is None else environ
    default, _ = VARIABLES[name]
    return env.get(PREFIX + name, default)
