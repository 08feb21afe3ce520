"""The monitoring kit (deploy/monitoring) checked by Prometheus's own tool: the rules load, every
alert's unit tests pass (kdtree-alerts.test.yml: each alert fires on what should set it off and
stays silent on its near misses), the example configuration loads, and every metric the rules
and the dashboard read is one the code exports."""

from __future__ import annotations

import json
import subprocess

import pytest
from monitoring_kit import (
    DASHBOARD,
    EXAMPLE_CONFIG,
    RULE_TESTS,
    RULES,
    dashboard_exprs,
    metric_names,
    rule_exprs,
    tool,
)
from prometheus_client import CollectorRegistry

from kdtree_inference.engine.metrics import EngineMetrics
from kdtree_inference.sglang.modes import Role, VerifySettings
from kdtree_inference.sglang.telemetry import VerifyTelemetry
from kdtree_parity.service import _Metrics as ParityMetrics


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent
    )


def test_promtool_accepts_the_rules() -> None:
    proc = promtool("check", "rules", RULES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in proc.stdout


def test_every_alert_passes_its_promtool_unit_tests() -> None:
    proc = promtool("test", "rules", RULE_TESTS.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re_alertnames(RULE_TESTS.read_text()))
    assert tested == set(rule_exprs()), "every alert needs a promtool unit test"


def re_alertnames(text: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if "alertname:" in line]


def test_promtool_accepts_the_example_configuration() -> None:
    proc = promtool("check", "config", EXAMPLE_CONFIG.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def exported_names() -> set[str]:
    """Every sample name the engine, the SGLang backend (both roles) and the parity service
    export (a counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``)."""
    registries = [EngineMetrics("validate").registry, ParityMetrics().registry]
    for role in Role:
        registry = CollectorRegistry()
        VerifyTelemetry(VerifySettings(), registry=registry, role=role)
        registries.append(registry)
    names = set()
    for registry in registries:
        for family in registry.collect():
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
            }.get(family.type, ("",))
            names |= {family.name + suffix for suffix in suffixes}
    return names


@pytest.mark.parametrize(
    "where, exprs",
    [("rules", lambda: list(rule_exprs().values())), ("dashboard", dashboard_exprs)],
)
def test_rules_and_dashboard_read_only_exported_metrics(where: str, exprs) -> None:
    exported = exported_names()
    read = {name for expr in exprs() for name in metric_names(expr)}
    assert read, where
    assert read <= exported, f"{where} reads metrics nobody exports: {sorted(read - exported)}"


def test_dashboard_is_grafana_json_with_unique_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["title"] == "kdtree"
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    # Each alert's metrics are on the dashboard, so a firing alert has a panel to look at.
    shown = {name for expr in dashboard_exprs() for name in metric_names(expr)}
    for alert, expr in rule_exprs().items():
        assert metric_names(expr) <= shown or alert == "KdtreeTargetDown", alert
