"""The service's guard rails, in process (no inference servers needed): auth, the refusal of
caller-supplied targets, unknown pairs and fields, and a service without a token."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kdtree_parity.corpus import load_corpus
from kdtree_parity.service import ConfigurationError, ServiceSettings, create_app, load_pairs
from kdtree_parity.settings import ENV_PREFIX, ParitySettings
from kdtree_parity.targets import Targets

TOKEN = "s3cret-token"


def settings(tmp_path: Path, token: str = TOKEN) -> ServiceSettings:
    return ServiceSettings(
        token=token,
        pairs={"default": Targets.from_urls("http://127.0.0.1:9", "http://127.0.0.1:10")},
        corpus="short",
        policy="short",
        db=str(tmp_path / "runs.sqlite3"),
        out=str(tmp_path / "out"),
    )


@pytest.fixture
def client(tmp_path: Path):
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


def test_post_runs_needs_the_bearer_token(client: TestClient) -> None:
    assert client.post("/runs", json={}).status_code == 401
    wrong = client.post("/runs", json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    basic = client.post("/runs", json={}, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    assert client.get("/runs").json() == []


@pytest.mark.parametrize(
    "body",
    [
        {"baseline": "http://10.0.0.1:80"},
        {"candidate": "http://169.254.169.254/"},
        {"targets": {"baseline": "x"}},
        {"pair": "default", "replica": "http://example.com"},
    ],
)
def test_caller_supplied_targets_are_refused(client: TestClient, body: dict) -> None:
    resp = client.post("/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 400
    assert "targets come from the service configuration" in resp.json()["detail"]
    assert client.get("/runs").json() == []  # nothing was started


def test_bad_requests_are_named(client: TestClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/runs", json={"pair": "other"}, headers=auth).status_code == 404
    resp = client.post("/runs", json={"corpus": "/etc/passwd"}, headers=auth)
    assert resp.status_code == 400 and "corpus must be" in resp.json()["detail"]
    resp = client.post("/runs", json={"colour": "red"}, headers=auth)
    assert resp.status_code == 400 and "unknown field" in resp.json()["detail"]
    resp = client.post("/runs", content=b"[1, 2]", headers=auth)
    assert resp.status_code == 400
    assert client.get("/runs/nope").status_code == 404
    assert client.get("/runs/nope/report.html").status_code == 404


def test_a_corpus_too_small_for_the_policy_is_refused(tmp_path: Path) -> None:
    config = settings(tmp_path)
    small = ServiceSettings(**{**config.__dict__, "policy": "default"})  # needs 200 prompts
    with pytest.raises(ConfigurationError, match="needs 200"):
        create_app(small)  # the configured corpus: refused before the service starts
    # The default policy needs 200 prompts and 200k tokens of context: the long corpus has both.
    config = ServiceSettings(**{**config.__dict__, "corpus": "long", "policy": "default"})
    with TestClient(create_app(config)) as c:
        resp = c.post(
            "/runs", json={"corpus": "short"}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert resp.status_code == 400 and "needs 200" in resp.json()["detail"]
        assert c.get("/runs").json() == []


def test_without_a_configured_token_mutations_are_disabled(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path, token=""))) as c:
        resp = c.post("/runs", json={}, headers={"Authorization": "Bearer "})
        assert resp.status_code == 403 and "KDTREE_PARITY_TOKEN" in resp.json()["detail"]
        assert c.get("/health").json()["status"] == "ok"
        assert "kdtree_parity_runs_running" in c.get("/metrics").text


def from_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> ServiceSettings:
    """The service's settings from exactly ``env`` (no other KDTREE_PARITY_* variable)."""
    for name in ParitySettings.model_fields:
        monkeypatch.delenv(ENV_PREFIX + name.upper(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return ServiceSettings.from_settings(ParitySettings())


def test_settings_from_env_and_pairs_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"KDTREE_PARITY_TOKEN": "t", "KDTREE_PARITY_BASELINE_URL": "http://b:1"}
    s = from_env(monkeypatch, env)
    assert s.token == "t" and s.pairs["default"].baseline.url == "http://b:1"
    assert s.pairs["default"].candidate.url == "http://127.0.0.1:30002"  # the documented default
    pairs = tmp_path / "pairs.yaml"
    pairs.write_text(
        "gpu0:\n  baseline: http://a:1\n  candidate: http://c:1\n  replica: http://r:1\n"
        "  candidate_image: sha256:c\n"
    )
    s = from_env(monkeypatch, {"KDTREE_PARITY_PAIRS": str(pairs)})
    assert s.pairs == {
        "gpu0": Targets.from_urls(
            "http://a:1", "http://c:1", "http://r:1", images={"candidate": "sha256:c"}
        )
    }
    assert s.pairs["gpu0"].record_images() == {"candidate": "sha256:c"}
    pairs.write_text("gpu0:\n  baseline: http://a:1\n")
    with pytest.raises(ValueError, match="needs 'baseline' and 'candidate'"):
        load_pairs(pairs)


def test_large_bodies_are_413_and_errors_never_echo_much(client: TestClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    huge = "p" * (20 << 20)
    resp = client.post("/runs", json={"pair": huge}, headers=auth)
    assert resp.status_code == 413 and len(resp.content) < 200
    chunked = client.post(
        "/runs", content=iter([b'{"pair": "', b"x" * (2 << 20), b'"}']), headers=auth
    )
    assert chunked.status_code == 413, chunked.text[:200]
    resp = client.post("/runs", json={"pair": "q" * 10_000}, headers=auth)
    assert resp.status_code == 404 and len(resp.content) < 300
    resp = client.get("/runs/" + "r" * 5000)
    assert resp.status_code == 404 and len(resp.content) < 300
    assert client.get("/runs").json() == []


def test_a_configured_corpus_edited_after_start_is_refused_with_409(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(load_corpus("short").raw)
    config = ServiceSettings(**{**settings(tmp_path).__dict__, "corpus": str(corpus)})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(config)) as c:
        corpus.write_bytes(load_corpus("short").raw + b'{"id": "new", "text": "added"}\n')
        resp = c.post("/runs", json={}, headers=auth)
        assert resp.status_code == 409
        assert "changed since the service started" in resp.json()["detail"]
        corpus.write_text('{"id": broken\n')
        resp = c.post("/runs", json={}, headers=auth)
        assert resp.status_code == 409 and "no longer loads" in resp.json()["detail"]
        assert c.get("/runs").json() == []


def test_request_fields_must_be_strings_and_the_scheme_is_case_insensitive(
    client: TestClient,
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    resp = client.post("/runs", json={"corpus": None}, headers=auth)
    assert resp.status_code == 400
    assert resp.json()["detail"] == "'corpus' must be a string (a name), not None"
    resp = client.post("/runs", json={"pair": 7}, headers=auth)
    assert resp.json()["detail"] == "'pair' must be a string (a name), not 7"
    resp = client.post("/runs", json={"colour": "red", "url": "x"}, headers=auth)
    assert resp.status_code == 400 and "targets come from the service" in resp.json()["detail"]
    resp = client.post(
        "/runs", json={"pair": "other"}, headers={"Authorization": f"bearer {TOKEN}"}
    )
    assert resp.status_code == 404  # authorized: the pair is what is wrong
    deep = b'{"pair": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    resp = client.post("/runs", content=deep, headers=auth)
    assert (
        resp.status_code == 400 and resp.json()["detail"] == "the request body is nested too deeply"
    )
    resp = client.post("/runs", content=b"{not json", headers=auth)
    assert resp.json()["detail"] == "the request body must be a JSON object"
    assert client.post("/runs", content=b"{not json").status_code == 401  # the token comes first
    assert client.get("/runs").json() == []


def test_metrics_the_alerts_watch_exist_at_zero_before_any_run(client: TestClient) -> None:
    # Prometheus sees no increase in a counter whose first sample is already above 0
    # (deploy/monitoring/kdtree-alerts.yml watches these for increases).
    metrics = client.get("/metrics").text
    for status in ("passed", "failed", "error", "interrupted"):
        assert f'kdtree_parity_runs_total{{status="{status}"}} 0.0' in metrics
    for klass in ("exact", "near_tie", "hard", "error"):
        assert f'kdtree_parity_prompts_total{{klass="{klass}"}} 0.0' in metrics
