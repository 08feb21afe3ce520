"""The alert rules and the dashboard in a real Prometheus scraping real servers on loopback.

Two reference engines run ``--attention validate`` (the op checked against the baseline on every
call, reported under the SGLang backend's ``kdtree_verify_*`` names): one whose op carries an
injected fault (``KDTREE_INJECT_FAULT=scale:0.5``), one without. Prometheus scrapes both every
second, evaluates deploy/monitoring/kdtree-alerts.yml every second, and must fire
KdtreeVerifyOverTolerance for the faulty engine only, while it has seen the clean one compare the
same kind of traffic within tolerance. Every dashboard query must run in that Prometheus.
A parity service gating a candidate with a wrong layer must, once its run fails, fire
KdtreeParityGateFailed and KdtreeParityHardDivergence, and nothing before.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from monitoring_kit import RULES, dashboard_exprs, tool
from parity_service_proc import ParityService
from parity_support import write_inputs

from kdtree_inference.engine.launch import free_port, stop_process

FAULT = "scale:0.5"
TOKEN = "monitoring-token"
DEADLINE_S = 90.0


@pytest.fixture
def engines(reference_server) -> dict[str, str]:
    options = {"attention": "validate", "device": "cpu", "max_new_tokens_limit": 64}
    return {
        "faulty": reference_server(env={"KDTREE_INJECT_FAULT": FAULT}, **options),
        "clean": reference_server(**options),
    }


class Prometheus:
    """A Prometheus process scraping ``jobs`` (job -> {name: host:port}) and evaluating the
    kit's rules, both every second."""

    def __init__(self, jobs: dict[str, dict[str, str]], tmp_path: Path) -> None:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [
                        {"targets": [target], "labels": {"name": name}}
                        for name, target in targets.items()
                    ],
                }
                for job, targets in jobs.items()
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        self.log_path = tmp_path / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, self.log_path.read_text()
            time.sleep(0.2)

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def prometheus(engines: dict[str, str], tmp_path: Path):
    targets = {name: url.removeprefix("http://") for name, url in engines.items()}
    prom = Prometheus({"kdtree-engine": targets}, tmp_path)
    try:
        prom.wait_ready()
        yield prom.url, targets
    finally:
        prom.stop()


def _alerts(prom: httpx.Client, name: str | None = None) -> list[dict]:
    """Active alerts (pending or firing), of ``name`` if given."""
    alerts = prom.get("/api/v1/alerts").json()["data"]["alerts"]
    return [a for a in alerts if name is None or a["labels"]["alertname"] == name]


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
                firing = [
                    a for a in _alerts(prom, "KdtreeVerifyOverTolerance") if a["state"] == "firing"
                ]
                time.sleep(0.5)
            # A few more evaluations: the clean engine must stay out of it all along.
            time.sleep(3)
            alerts = _alerts(prom)
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


def test_a_failed_gate_fires_the_parity_alerts_and_nothing_before(
    reference_server, tmp_path: Path
) -> None:
    baseline = reference_server(device="cpu")
    candidate = reference_server(device="cpu", fault_layer=1, fault_scale=1.5)  # wrong answers
    corpus, policy = write_inputs(tmp_path, 8)
    service = ParityService(
        {
            "KDTREE_PARITY_TOKEN": TOKEN,
            "KDTREE_PARITY_BASELINE_URL": baseline,
            "KDTREE_PARITY_CANDIDATE_URL": candidate,
            "KDTREE_PARITY_CORPUS": str(corpus),
            "KDTREE_PARITY_POLICY": str(policy),
            "KDTREE_PARITY_DB": str(tmp_path / "runs.sqlite3"),
            "KDTREE_PARITY_OUT": str(tmp_path / "out"),
        },
        tmp_path / "service.log",
    )
    prom = Prometheus({"kdtree-parity": {"parity": f"127.0.0.1:{service.port}"}}, tmp_path)
    try:
        service.wait()
        prom.wait_ready()
        with httpx.Client(base_url=prom.url, timeout=10) as p, httpx.Client(timeout=30) as http:
            # Prometheus has the service's zero before the run: the failure is an increase.
            deadline = time.monotonic() + DEADLINE_S
            while not _query(p, 'kdtree_parity_runs_total{status="failed"} == 0'):
                assert time.monotonic() < deadline, _query(p, "up")
                time.sleep(0.5)
            assert _alerts(p) == []
            auth = {"Authorization": f"Bearer {TOKEN}"}
            run = http.post(f"{service.url}/runs", json={}, headers=auth).json()
            while run["status"] == "running":
                assert time.monotonic() < deadline, run
                time.sleep(0.5)
                run = http.get(f"{service.url}/runs/{run['id']}").json()
            assert run["status"] == "failed", run
            expected = {"KdtreeParityGateFailed", "KdtreeParityHardDivergence"}
            while {a["labels"]["alertname"] for a in _alerts(p) if a["state"] == "firing"} != (
                expected
            ):
                assert time.monotonic() < deadline, _alerts(p)
                time.sleep(0.5)
            alerts = _alerts(p)
    finally:
        prom.stop()
        service.stop()
    assert {a["labels"]["alertname"] for a in alerts} == expected
    assert {a["labels"]["instance"] for a in alerts} == {f"127.0.0.1:{service.port}"}
