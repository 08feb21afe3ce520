"""Telemetry: metric updates, the publish log line, shadow-error streaks, and SGLang's
``--enable-metrics`` multiprocess mode (values written by one process, read by another)."""

import json
import logging
import subprocess
import sys
import textwrap

from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from kdtree_inference.sglang.comparison import LayerStats
from kdtree_inference.sglang.modes import VerifyMode, VerifySettings
from kdtree_inference.sglang.telemetry import PUBLISH_EVENT, VerifyTelemetry


def value(registry, name, **labels):
    return registry.get_sample_value(name, {"tp_rank": "3", **labels})


def stats(over: int, max_abs: float = 0.01):
    return [
        LayerStats(layer_id=0, max_abs=max_abs, max_rel=0.001, over_tolerance=over, compared=100),
        LayerStats(layer_id=1, max_abs=0.5, max_rel=0.002, over_tolerance=0, compared=100),
        LayerStats(layer_id=2, max_abs=0.0, max_rel=0.0, over_tolerance=0, compared=0),
    ]


def test_publish_sets_gauges_counts_and_logs_one_line(caplog):
    registry = CollectorRegistry()
    telemetry = VerifyTelemetry(VerifySettings(VerifyMode.VALIDATE), tp_rank=3, registry=registry)
    with caplog.at_level(logging.INFO, logger="kdtree.verify"):
        summary = telemetry.publish(step=42, stats=stats(over=7))
    assert value(registry, "kdtree_verify_mode", mode="validate") == 1
    assert value(registry, "kdtree_verify_mode", mode="on") == 0
    assert value(registry, "kdtree_verify_max_abs_error", layer="1") == 0.5
    assert value(registry, "kdtree_verify_max_rel_error", layer="0") == 0.001
    assert value(registry, "kdtree_verify_over_tolerance_total", layer="0") == 7
    assert value(registry, "kdtree_verify_max_abs_error", layer="2") is None  # compared nothing
    assert value(registry, "kdtree_verify_compared_elements_total") == 200
    assert value(registry, "kdtree_verify_publishes_total") == 1
    assert summary.worst_layer == 1 and summary.over_tolerance == 7 and summary.layers == 2
    (record,) = [r for r in caplog.records if r.getMessage().startswith(PUBLISH_EVENT)]
    assert record.levelname == "WARNING"  # over tolerance in validate mode
    payload = json.loads(record.getMessage()[len(PUBLISH_EVENT) :])
    assert payload == summary.__dict__ and payload["step"] == 42


def test_nothing_compared_publishes_nothing():
    registry = CollectorRegistry()
    telemetry = VerifyTelemetry(VerifySettings(VerifyMode.VALIDATE), tp_rank=3, registry=registry)
    assert telemetry.publish(1, []) is None
    assert value(registry, "kdtree_verify_publishes_total") is None


def test_repeated_excess_in_on_mode_is_an_error_and_counted(caplog):
    registry = CollectorRegistry()
    settings = VerifySettings(VerifyMode.ON, shadow_every=1, shadow_error_streak=2)
    telemetry = VerifyTelemetry(settings, tp_rank=3, registry=registry)
    with caplog.at_level(logging.INFO, logger="kdtree.verify"):
        flags = [
            telemetry.publish(i, stats(over=o)).shadow_error
            for i, o in enumerate([1, 1, 0, 1, 1, 1, 1])
        ]
    assert flags == [False, True, False, False, True, False, True]
    assert value(registry, "kdtree_verify_shadow_errors_total") == 3
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 3


def test_nan_is_the_worst_layer():
    telemetry = VerifyTelemetry(
        VerifySettings(VerifyMode.VALIDATE), tp_rank=3, registry=CollectorRegistry()
    )
    summary = telemetry.publish(1, stats(over=1, max_abs=float("nan")))
    assert summary.worst_layer == 0


def test_metrics_reach_a_multiprocess_collector(tmp_path):
    """As under SGLang --enable-metrics: a scheduler process writes, the HTTP process reads."""
    writer = textwrap.dedent(
        """
        from kdtree_inference.sglang.comparison import LayerStats
        from kdtree_inference.sglang.modes import VerifyMode, VerifySettings
        from kdtree_inference.sglang.telemetry import VerifyTelemetry

        t = VerifyTelemetry(VerifySettings(VerifyMode.ON, shadow_every=4), tp_rank=1)
        t.verify_steps(5)
        t.verify_steps(2, graph_replay=True)
        t.kernel_calls(61)
        t.fallbacks("fp8_kv", 2)
        t.publish(5, [LayerStats(7, 0.25, 0.01, 3, 1024)])
        """
    )
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", writer], env=env, check=True, timeout=60)
    assert list(tmp_path.glob("*.db")), "the writer left no multiprocess files"
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()

    def sample(name, **labels):
        return registry.get_sample_value(name, {"tp_rank": "1", **labels})

    assert sample("kdtree_verify_steps_total") == 7
    assert sample("kdtree_verify_graph_replays_total") == 2
    assert sample("kdtree_verify_kernel_calls_total") == 61
    assert sample("kdtree_verify_fallbacks_total", reason="fp8_kv") == 2
    assert sample("kdtree_verify_max_abs_error", layer="7") == 0.25
    assert sample("kdtree_verify_over_tolerance_total", layer="7") == 3
    assert "kdtree_verify_mode" in text


def test_the_series_alerts_watch_exist_at_zero_before_anything_happens():
    # Prometheus sees no increase in a counter whose first sample is already above 0, so the
    # alert rules (deploy/monitoring) need these at 0 from the start.
    registry = CollectorRegistry()
    telemetry = VerifyTelemetry(VerifySettings(VerifyMode.ON), tp_rank=3, registry=registry)
    assert value(registry, "kdtree_verify_shadow_errors_total") == 0
    assert value(registry, "kdtree_verify_fallbacks_total", reason="invalid_inputs") == 0
    telemetry.publish(step=1, stats=stats(over=0))
    assert value(registry, "kdtree_verify_over_tolerance_total", layer="0") == 0
    assert value(registry, "kdtree_verify_over_tolerance_total", layer="1") == 0
