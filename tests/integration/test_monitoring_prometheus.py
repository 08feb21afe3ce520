"""The alert rules and the dashboard in a real Prometheus scraping real reference engines.

Two engines run ``--attention validate`` (the op checked against the baseline on every call,
reported under the SGLang backend's ``kdtree_verify_*`` names): one whose op carries an injected
fault (``KDTREE_INJECT_FAULT=scale:0.5``), one without. Prometheus scrapes both every second,
evaluates deploy/monitoring/kdtree-alerts.yml every second, and must fire
KdtreeVerifyOverTolerance for the faulty engine only, while it has seen the clean one compare
the same kind of traffic within tolerance. Every dashboard query must run in that Prometheus.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from monitoring_kit import RULES, dashboard_exprs, tool

from kdtree_inference.engine.launch import free_port, stop_process

FAULT = "scale:0.5"
DEADLINE_S = 90.0


@pytest.fixture
def engines(reference_server) -> dict[str, str]:
    options = {"attention": "validate", "device": "cpu", "max_new_tokens_limit": 64}
    return {
        "faulty": reference_server(env={"KDTREE_INJECT_FAULT": FAULT}, **options),
        "clean": reference_server(**options),
    }


@pytest.fixture
def prometheus(engines: dict[str, str], tmp_path: Path):
    targets = {name: url.removeprefix("http://") for name, url in engines.items()}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "kdtree-engine",
                "static_configs": [
                    {"targets": [target], "labels": {"engine": name}}
                    for name, target in targets.items()
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        yield url, targets
    finally:
        stop_process(proc)
        log.close()


def _query(prom: httpx.Client, expr: str) -> list[dict]:
    body = prom.get("/api/v1/query", params={"query": expr}).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _traffic(engines: dict[str, str], stop: threading.Event) -> None:
    """Short greedy generations on both engines until ``stop``: verify steps to compare."""
    body = {"text": "monitor me", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            for url in engines.values():
                assert http.post(f"{url}/generate", json=body).status_code == 200
            stop.wait(0.3)


def test_over_tolerance_fires_for_the_faulty_engine_only(
    engines: dict[str, str], prometheus: tuple[str, dict[str, str]]
) -> None:
    url, targets = prometheus
    stop = threading.Event()
    driver = threading.Thread(target=_traffic, args=(engines, stop), daemon=True)
    driver.start()
    firing: list[dict] = []
    try:
        with httpx.Client(base_url=url, timeout=10) as prom:
            deadline = time.monotonic() + DEADLINE_S
            while not firing:
                assert driver.is_alive(), "traffic to the engines failed"
                assert time.monotonic() < deadline, _query(prom, "ALERTS")
                alerts = prom.get("/api/v1/alerts").json()["data"]["alerts"]
                firing = [
                    a
                    for a in alerts
                    if a["labels"]["alertname"] == "KdtreeVerifyOverTolerance"
                    and a["state"] == "firing"
                ]
                time.sleep(0.5)
            # A few more evaluations: the clean engine must stay out of it all along.
            time.sleep(3)
            alerts = prom.get("/api/v1/alerts").json()["data"]["alerts"]
            clean = f'instance="{targets["clean"]}"'
            clean_seen = _query(prom, f"kdtree_verify_compared_elements_total{{{clean}}}")
            clean_over = _query(prom, f"kdtree_verify_over_tolerance_total{{{clean}}}")
            up = _query(prom, 'up{job="kdtree-engine"}')
            results = {expr: _query(prom, expr.replace("$__rate_interval", "1m"))
                       for expr in dashboard_exprs()}  # fmt: skip
    finally:
        stop.set()
        driver.join(timeout=30)

    assert {a["labels"]["instance"] for a in firing} == {targets["faulty"]}
    assert firing[0]["labels"]["severity"] == "critical"
    assert not [a for a in alerts if a["labels"].get("instance") == targets["clean"]], alerts
    assert [a["labels"]["instance"] for a in alerts] == [targets["faulty"]]
    # The clean engine was scraped and compared real traffic: its silence means something.
    assert float(clean_seen[0]["value"][1]) > 0
    assert sorted(s["metric"]["layer"] for s in clean_over) == ["0", "1"]
    assert all(float(s["value"][1]) == 0 for s in clean_over)
    assert sorted(float(s["value"][1]) for s in up) == [1.0, 1.0]
    # Every dashboard query runs; those on metrics the engines export return series.
    absent_here = ("fallbacks", "shadow_errors", "kdtree_parity_")
    for expr, series in results.items():
        if not any(word in expr for word in absent_here):
            assert series, f"dashboard query returned nothing: {expr}"
