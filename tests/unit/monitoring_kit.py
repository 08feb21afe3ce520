"""The monitoring kit's files (deploy/monitoring) and the Prometheus tools that check them.

``prometheus`` and ``promtool`` come from scripts/setup_venv.sh (Debian's prometheus package,
unpacked into the venv's bin), else from PATH.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy" / "monitoring"
RULES = KIT / "kdtree-alerts.yml"
RULE_TESTS = KIT / "kdtree-alerts.test.yml"
EXAMPLE_CONFIG = KIT / "prometheus.yml"
DASHBOARD = KIT / "grafana" / "kdtree-dashboard.json"
METRIC = re.compile(r"\b(kdtree_[a-z_]+)\b")
BOTH_PREFIXES = "kdtree_(verify|draft_extend)_"


def tool(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; a clear failure when neither place has it."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"{name} not found in {beside.parent} or on PATH: run scripts/setup_venv.sh"
    return found


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def rule_exprs() -> dict[str, str]:
    """Alert name -> its PromQL expression."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def metric_names(expr: str) -> set[str]:
    """The kdtree metric names PromQL ``expr`` reads; a ``kdtree_(verify|draft_extend)_x``
    name matcher reads both of its names."""
    names: set[str] = set()
    for prefix in ("kdtree_verify_", "kdtree_draft_extend_"):
        names |= set(METRIC.findall(expr.replace(BOTH_PREFIXES, prefix)))
    return names
