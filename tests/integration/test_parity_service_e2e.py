"""The parity service (``kdtree-parity serve``, a real uvicorn subprocess) running a gate
against real reference-engine servers: auth, one run at a time, progress, reports, metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from parity_service_proc import ParityService
from parity_support import write_inputs

from kdtree_parity.report import build_report
from kdtree_parity.report.schema import Report
from kdtree_parity.store import Store

pytestmark = pytest.mark.slow
TOKEN = "integration-token"


@pytest.fixture
def parity_service(reference_server, tmp_path: Path):
    baseline, candidate = reference_server(), reference_server()
    corpus, policy = write_inputs(tmp_path, 6)
    env = {
        "KDTREE_PARITY_TOKEN": TOKEN,
        "KDTREE_PARITY_BASELINE_URL": baseline,
        "KDTREE_PARITY_CANDIDATE_URL": candidate,
        "KDTREE_PARITY_CORPUS": str(corpus),
        "KDTREE_PARITY_POLICY": str(policy),
        "KDTREE_PARITY_DB": str(tmp_path / "runs.sqlite3"),
        "KDTREE_PARITY_OUT": str(tmp_path / "out"),
    }
    service = ParityService(env, tmp_path / "service.log")
    try:
        service.wait()
        yield service.url, tmp_path, service.proc
    finally:
        service.stop()


def test_service_runs_the_gate_for_its_configured_pair(parity_service) -> None:
    url, tmp_path, proc = parity_service
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/runs", json={}).status_code == 401
        refused = http.post("/runs", json={"candidate": "http://127.0.0.1:1"}, headers=auth)
        assert refused.status_code == 400

        created = http.post("/runs", json={}, headers=auth)
        assert created.status_code == 202, created.text
        run = created.json()
        assert run["status"] == "running" and run["progress"]["total"] == 6
        busy = http.post("/runs", json={}, headers=auth)
        assert busy.status_code == 409 and run["id"] in busy.json()["detail"]

        seen_progress = set()
        deadline = time.monotonic() + 240
        while run["status"] == "running":
            assert time.monotonic() < deadline, run
            time.sleep(0.5)
            run = http.get(f"/runs/{run['id']}").json()
            seen_progress.add(run["progress"]["done"])
        assert run["status"] == "passed", run
        assert run["verdict"]["status"] == "pass" and run["progress"]["done"] == 6
        assert max(seen_progress) == 6

        report = Report.model_validate(http.get(f"/runs/{run['id']}/report.json").json())
        assert report.verdict.status == "pass" and report.summary.prompts_compared == 6
        html = http.get(f"/runs/{run['id']}/report.html")
        assert html.status_code == 200 and "Parity verdict: PASS" in html.text
        assert (tmp_path / "out" / run["id"] / "report.html").is_file()
        assert [r["id"] for r in http.get("/runs").json()] == [run["id"]]
        metrics = http.get("/metrics").text
        assert 'kdtree_parity_runs_total{status="passed"} 1.0' in metrics
        assert 'kdtree_parity_prompts_total{klass="exact"} 6.0' in metrics
        # A second run is accepted once the first is done (the 203-prompt corpus: still running
        # when the service is stopped below).
        again = http.post("/runs", json={"corpus": "default"}, headers=auth)
        assert again.status_code == 202 and again.json()["progress"]["total"] == 203
    # Stopping the service mid-run records that run as interrupted, never as passed.
    proc.terminate()
    proc.wait(timeout=30)  # uvicorn shuts down gracefully, then re-raises SIGTERM (-15)
    lines = [json.loads(line) for line in (tmp_path / "service.log").read_text().splitlines()]
    assert any(line["message"] == "Application shutdown complete." for line in lines)
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    events = [line for line in lines if line["logger"] == "kdtree_parity.service"]
    first = [e for e in events if e.get("run_id") == run["id"]]
    assert first[0]["message"] == "run_started"
    assert first[0]["prompts"] == 6 and first[0]["pair"] == "default"
    assert set(first[0]["targets"]) == {"baseline", "candidate", "aa"}
    progress = [e for e in first if e["message"] == "run_progress"]
    assert progress[-1]["done"] == progress[-1]["total"] == 6
    assert progress[-1]["classes"] == {"exact": 6} and progress[-1]["request_errors"] == 0
    (end,) = [e for e in first if e["message"] == "run_finished"]
    assert end["status"] == "passed" and end["verdict"] == "pass" and end["reasons"] == []
    assert end["report"] == str(tmp_path / "out" / run["id"] / "report.json")
    assert first[-1] is end and end["duration_s"] > 0
    (cut,) = [e for e in events if e["message"] == "run_finished" and e["run_id"] != run["id"]]
    assert cut["status"] == "interrupted" and cut["verdict"] is None
    store = Store(tmp_path / "runs.sqlite3")
    record = store.get_run(again.json()["id"])
    assert record.status == "interrupted" and record.verdict is None
    assert build_report(store, record.id).verdict.status == "error"
    store.close()
