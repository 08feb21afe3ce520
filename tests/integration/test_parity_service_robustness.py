"""The parity service (a real ``kdtree-parity serve`` subprocess) refuses to start with a
configuration no run could use, and answers every malformed request with a 4xx JSON error."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from parity_service_proc import ParityService

pytestmark = pytest.mark.slow
TOKEN = "robustness-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEEP = 100_000
GOOD_LINE = '{"id": "a", "text": "hello"}\n'


def service_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    # The targets are never contacted: no request below starts a run.
    env = {
        "KDTREE_PARITY_TOKEN": TOKEN,
        "KDTREE_PARITY_BASELINE_URL": "http://127.0.0.1:9",
        "KDTREE_PARITY_CANDIDATE_URL": "http://127.0.0.1:10",
        "KDTREE_PARITY_CORPUS": "short",
        "KDTREE_PARITY_POLICY": "short",
        "KDTREE_PARITY_DB": str(tmp_path / "runs.sqlite3"),
        "KDTREE_PARITY_OUT": str(tmp_path / "out"),
    }
    return {**env, **{f"KDTREE_PARITY_{k.upper()}": v for k, v in overrides.items()}}


@pytest.mark.parametrize(
    ("setting", "content", "message"),
    [
        ("corpus", "", "the corpus has no entries"),
        ("corpus", GOOD_LINE + "{not json\n", ":2: invalid JSON"),
        ("corpus", '{"id": "a", "text": "x", "input_ids": [1]}\n', "exactly one of 'text'"),
        ("policy", "gate:\n  min_prompt: 3\n", "gate.min_prompt: Extra inputs are not permitted"),
        ("policy", "gate:\n  min_prompts: 500\n", "needs 500"),
        ("candidate_url", None, "'not-a-url' is not an http:// or https:// URL"),
    ],
)
def test_a_broken_configuration_refuses_to_start(
    tmp_path: Path, setting: str, content: str | None, message: str
) -> None:
    if content is None:
        value = "not-a-url"
    else:
        value = str(tmp_path / f"configured.{setting}")
        Path(value).write_text(content)
    service = ParityService(service_env(tmp_path, **{setting: value}), tmp_path / "service.log")
    try:
        returncode = service.proc.wait(timeout=60)
    finally:
        service.stop()
    log = service.log()
    assert returncode == 2, log
    assert message in log and "configuration is unusable" in log
    assert "Traceback" not in log and "Uvicorn running" not in log


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    tmp_path = tmp_path_factory.mktemp("parity-service")
    proc = ParityService(service_env(tmp_path), tmp_path / "service.log")
    try:
        proc.wait()
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * DEEP + b"]" * DEEP, id="deep-list"),
        pytest.param(b'{"pair": ' + b"[" * DEEP + b"]" * DEEP + b"}", id="deep-pair"),
        pytest.param(b'{"pair": ["default"]}', id="pair-list"),
        pytest.param(b'{"pair": {}}', id="pair-object"),
        pytest.param(b'{"pair": null}', id="pair-null"),
        pytest.param(b'{"corpus": 5}', id="corpus-number"),
        pytest.param(b'{"corpus": ["short"]}', id="corpus-list"),
        pytest.param(b'{"pair": "\xff"}', id="not-utf8"),
        pytest.param(b"[]", id="not-an-object"),
    ],
)
def test_malformed_run_requests_are_4xx_json(service: ParityService, raw: bytes) -> None:
    resp = httpx.post(
        service.url + "/runs",
        content=raw,
        headers={**AUTH, "content-type": "application/json"},
        timeout=30,
    )
    assert 400 <= resp.status_code < 500, resp.text[:300]
    assert resp.json()["detail"]
    assert httpx.get(service.url + "/runs", timeout=30).json() == []  # no run was started


def test_malformed_queries_are_4xx_json(service: ParityService) -> None:
    for path in ("/runs?limit=many", "/runs/" + "x" * 5000, "/nothing-here"):
        resp = httpx.get(service.url + path, timeout=30)
        assert 400 <= resp.status_code < 500 and resp.json()["detail"], (path, resp.text[:200])
