"""The parity sidecar as an HTTP service (FastAPI).

Targets come only from the service's configuration (environment, or a pairs file), never from
the caller, so the service cannot be pointed at arbitrary hosts. ``POST /runs`` needs the bearer
token from ``KDTREE_PARITY_TOKEN``; without a configured token it is refused outright. One run at
a time per target pair (409 otherwise), across every service sharing the database: the pair's
exclusion and each run's ownership live in the store (``store.py``: owner, lease, heartbeat),
so a second service on the same file neither takes a busy pair nor declares the first one's
runs dead while their lease holds. Request bodies are limited to ``MAX_BODY_BYTES`` (413), and
no answer echoes more than ``SHOWN_CHARS`` characters of what the caller sent.

Endpoints: ``POST /runs``, ``GET /runs``, ``GET /runs/{id}`` (status and progress),
``GET /runs/{id}/report.json``, ``GET /runs/{id}/report.html``, ``GET /health``, ``GET /metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kdtree_parity.client import url_problem
from kdtree_parity.config import env_default
from kdtree_parity.corpus import BUILTIN_CORPORA, Corpus, CorpusError, load_corpus
from kdtree_parity.policy import LoadedPolicy, PolicyError, load_policy
from kdtree_parity.report import build_report, render_html
from kdtree_parity.results import PromptResult
from kdtree_parity.runner import Targets, corpus_too_small, execute_run, start_run
from kdtree_parity.store import LeaseLost, PairBusy, RunRecord, Store
from kdtree_parity.yaml_load import load_yaml

log = logging.getLogger("kdtree_parity.service")

# Keys a caller might use to aim the service at its own hosts: refused with an explanation.
TARGET_KEYS = frozenset({"baseline", "candidate", "replica", "floor", "targets", "url", "urls"})
REQUEST_KEYS = frozenset({"pair", "corpus"})
IMAGE_KEYS = ("baseline_image", "candidate_image", "replica_image")
MAX_BODY_BYTES = 1 << 20  # a run request is a few dozen bytes; anything near this is abuse
SHOWN_CHARS = 80  # at most this much of a caller's value is quoted back in an error


def _shown(value: object) -> str:
    """``repr(value)``, cut to SHOWN_CHARS: an error names what was sent without echoing it all."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class BodyLimit:
    """ASGI middleware: a declared or streamed request body over ``limit`` bytes is a 413."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.limit:
            response = JSONResponse({"detail": self._message()}, status_code=413)
            await response(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:  # chunked, no length declared: stop reading here
                raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)

    def _message(self) -> str:
        return f"the request body is larger than {self.limit} bytes"


class ConfigurationError(ValueError):
    """The service's configuration cannot serve a single run: it refuses to start."""


@dataclass(frozen=True)
class ServiceSettings:
    """Everything the service needs, read once at start (``check`` before serving)."""

    token: str
    pairs: dict[str, Targets]
    corpus: str
    policy: str
    db: str
    out: str
    lease_s: float = 60.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ServiceSettings:
        env = dict(environ)
        pairs_file = env.get("KDTREE_PARITY_PAIRS", "")
        if pairs_file:
            pairs = load_pairs(Path(pairs_file))
        else:
            pairs = {
                "default": Targets(
                    env_default("BASELINE_URL", env),
                    env_default("CANDIDATE_URL", env),
                    env_default("REPLICA_URL", env) or None,
                    env_default("BASELINE_IMAGE", env) or None,
                    env_default("CANDIDATE_IMAGE", env) or None,
                    env_default("REPLICA_IMAGE", env) or None,
                    env_default("FLOOR_URL", env) or None,
                    env_default("FLOOR_IMAGE", env) or None,
                )
            }
        lease = env_default("LEASE_S", env)
        try:
            lease_s = float(lease)
        except ValueError:
            raise ConfigurationError(f"KDTREE_PARITY_LEASE_S={lease!r} is not a number") from None
        return cls(
            token=env_default("TOKEN", env),
            pairs=pairs,
            corpus=env_default("CORPUS", env),
            policy=env_default("POLICY", env),
            db=env_default("DB", env),
            out=env_default("OUT", env),
            lease_s=lease_s,
        )

    def check(self) -> tuple[Corpus, LoadedPolicy]:
        """The configured corpus and policy as they are now; ConfigurationError naming every
        problem a POST /runs would otherwise hit."""
        problems = []
        if not 1 <= self.lease_s <= 3600:
            problems.append(f"the lease must be 1..3600 seconds, got {self.lease_s:g}")
        corpus = policy = None
        try:
            corpus = load_corpus(self.corpus)
        except CorpusError as exc:
            problems.append(str(exc))
        try:
            policy = load_policy(self.policy)
        except PolicyError as exc:
            problems.append(str(exc))
        if (
            corpus is not None
            and policy is not None
            and (small := corpus_too_small(corpus, policy))
        ):
            problems.append(f"{small}: no run could ever decide")
        for name, targets in self.pairs.items():
            for role, url in targets.as_roles().items():
                if problem := url_problem(url):
                    problems.append(f"pair {name!r} {role}: {problem}")
        if problems or corpus is None or policy is None:
            raise ConfigurationError(
                "the parity service's configuration is unusable:\n" + "\n".join(problems)
            )
        return corpus, policy


def load_pairs(path: Path) -> dict[str, Targets]:
    """A YAML mapping ``name: {baseline: URL, candidate: URL, replica: URL?, floor: URL?,
    *_image: label?}`` (``floor``: the A/A' target)."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{path}: cannot read the pairs file: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigurationError(f"{path}: expected a non-empty mapping of pair name -> targets")
    pairs = {}
    for name, spec in data.items():
        if not isinstance(spec, dict) or not {"baseline", "candidate"} <= set(spec):
            raise ConfigurationError(f"{path}: pair {name!r} needs 'baseline' and 'candidate' URLs")
        unknown = set(spec) - {
            "baseline",
            "candidate",
            "replica",
            "floor",
            "floor_image",
            *IMAGE_KEYS,
        }
        if unknown:
            raise ConfigurationError(f"{path}: pair {name!r} has unknown key(s) {sorted(unknown)}")
        pairs[str(name)] = Targets(
            spec["baseline"],
            spec["candidate"],
            spec.get("replica"),
            *(spec.get(key) for key in IMAGE_KEYS),
            floor=spec.get("floor"),
            floor_image=spec.get("floor_image"),
        )
    return pairs


@dataclass
class _Live:
    """In-memory progress of the runs this process is executing."""

    tasks: dict[str, asyncio.Task] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.runs = Counter(
            "kdtree_parity_runs_total",
            "finished runs by status",
            ["status"],
            registry=self.registry,
        )
        self.running = Gauge(
            "kdtree_parity_runs_running", "runs in progress", registry=self.registry
        )
        self.prompts = Counter(
            "kdtree_parity_prompts_total",
            "prompts replayed, by candidate-vs-baseline class",
            ["klass"],
            registry=self.registry,
        )
        self.errors = Counter(
            "kdtree_parity_request_errors_total",
            "failed requests (after retries) by role and kind",
            ["role", "kind"],
            registry=self.registry,
        )

    def record(self, result: PromptResult) -> None:
        for role, outcome in result.outcomes.items():
            if outcome.error is not None:
                self.errors.labels(role, outcome.error.kind).inc()
        c = result.candidate
        klass = "error" if c is None else "exact" if c.exact else c.divergence_class or "hard"
        self.prompts.labels(klass).inc()


def _run_json(record: RunRecord, live: _Live) -> dict[str, Any]:
    return {
        "id": record.id,
        "status": record.status,
        "pair": record.pair,
        "progress": {
            "done": live.done.get(record.id, record.prompts_ok),
            "total": record.prompts_total,
        },
        "verdict": record.verdict,
        "error": record.error,
        "targets": {role: url for role, (url, _) in record.targets.items()},
        "corpus": {"source": record.corpus_source, "sha256": record.corpus_sha256},
        "policy": {"source": record.policy_source, "sha256": record.policy_sha256},
        "links": {
            "self": f"/runs/{record.id}",
            "report_json": f"/runs/{record.id}/report.json",
            "report_html": f"/runs/{record.id}/report.html",
        },
    }


def create_app(settings: ServiceSettings) -> FastAPI:
    """The service; ``settings`` are fixed for its lifetime and checked here (ConfigurationError).

    The configured corpus and policy files are hashed now: a run asked for after either file
    changed (or broke) is refused with 409, naming the change; restart the service to take it.
    """
    started_corpus, started_policy = settings.check()
    live = _Live()
    metrics = _Metrics()
    state: dict[str, Store] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Runs another process left running stay as they are: each reads as interrupted only
        # once its own lease expired (store.py), whoever starts or restarts meanwhile.
        store = Store(settings.db, lease_s=settings.lease_s)
        state["store"] = store
        try:
            yield
        finally:
            for task in list(live.tasks.values()):
                task.cancel()
            for task in list(live.tasks.values()):
                with contextlib.suppress(BaseException):
                    await task
            store.close()

    app = FastAPI(title="kdtree parity sidecar", version="0.1.0", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    def store() -> Store:
        return state["store"]

    def require_token(request: Request) -> None:
        if not settings.token:
            raise HTTPException(
                403, "mutating endpoints are disabled: the service has no KDTREE_PARITY_TOKEN"
            )
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
            given.strip().encode(), settings.token.encode()
        ):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    def get_record(run_id: str) -> RunRecord:
        try:
            return store().get_run(run_id)
        except KeyError:
            raise HTTPException(404, f"no run {_shown(run_id)}") from None

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "running": len(live.tasks), "pairs": sorted(settings.pairs)}

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/runs", status_code=202)
    async def create_run(request: Request) -> JSONResponse:
        require_token(request)
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise HTTPException(400, "the request body must be a JSON object") from None
        except RecursionError:
            raise HTTPException(400, "the request body is nested too deeply") from None
        if not isinstance(body, dict):
            raise HTTPException(400, "the request body must be a JSON object")
        aimed = sorted(TARGET_KEYS & set(body))
        if aimed:
            raise HTTPException(
                400,
                f"refused: {', '.join(aimed)} cannot be set by a caller; targets come from the "
                f"service configuration (pairs: {', '.join(sorted(settings.pairs))})",
            )
        unknown = sorted(set(body) - REQUEST_KEYS)
        if unknown:
            raise HTTPException(400, f"unknown field(s) {unknown}; allowed: {sorted(REQUEST_KEYS)}")
        for key in REQUEST_KEYS & set(body):
            if not isinstance(body[key], str):
                raise HTTPException(
                    400, f"{key!r} must be a string (a name), not {_shown(body[key])}"
                )
        pair = body.get("pair", "default")
        if pair not in settings.pairs:
            raise HTTPException(404, f"no configured pair {_shown(pair)}")
        corpus_spec = body.get("corpus", settings.corpus)
        if corpus_spec != settings.corpus and corpus_spec not in BUILTIN_CORPORA:
            raise HTTPException(
                400, f"corpus must be the configured one or a shipped name {BUILTIN_CORPORA}"
            )
        corpus = _unchanged(corpus_spec, load_corpus, CorpusError, started_corpus, "corpus")
        policy = _unchanged(settings.policy, load_policy, PolicyError, started_policy, "policy")
        too_small = corpus_too_small(corpus, policy)
        if too_small:
            raise HTTPException(400, f"{too_small}: such a run could never decide")
        try:
            run_id = start_run(
                store(), corpus, policy, settings.pairs[pair], pair=pair, out_dir=settings.out,
                exclusive=True,
            )  # fmt: skip
        except PairBusy as exc:
            raise HTTPException(409, str(exc)) from None
        live.done[run_id] = 0
        metrics.running.inc()

        def progress(done: int, _total: int, result: PromptResult | None) -> None:
            live.done[run_id] = done
            if result is not None:
                metrics.record(result)

        async def run() -> None:
            status = "error"
            try:
                outcome = await execute_run(store(), run_id, progress=progress)
                status = outcome.status
            except asyncio.CancelledError:
                status = "interrupted"
                raise
            except LeaseLost:
                status = "interrupted"  # taken over by another process; logged by the runner
            except Exception:
                log.exception("run %s crashed", run_id)
            finally:
                metrics.running.dec()
                metrics.runs.labels(status).inc()
                live.tasks.pop(run_id, None)

        live.tasks[run_id] = asyncio.create_task(run(), name=f"parity-run-{run_id}")
        return JSONResponse(_run_json(store().get_run(run_id), live), status_code=202)

    @app.get("/runs")
    async def list_runs(limit: int = 50) -> list[dict[str, Any]]:
        return [_run_json(r, live) for r in store().list_runs(min(max(limit, 1), 500))]

    @app.get("/runs/{run_id}")
    async def get_run(run_id: str) -> dict[str, Any]:
        return _run_json(get_record(run_id), live)

    @app.get("/runs/{run_id}/report.json")
    async def report_json(run_id: str) -> JSONResponse:
        get_record(run_id)
        return JSONResponse(build_report(store(), run_id).model_dump(mode="json"))

    @app.get("/runs/{run_id}/report.html")
    async def report_html(run_id: str) -> HTMLResponse:
        get_record(run_id)
        return HTMLResponse(render_html(build_report(store(), run_id)))

    return app


def _unchanged(spec: str, load: Any, error: type[Exception], started: Any, what: str) -> Any:
    """Load ``spec`` as it is now; when it is the configured file the service started with, it
    must still have the same bytes (409 otherwise: a run must use what the service checked)."""
    try:
        now = load(spec)
    except error as exc:
        raise HTTPException(
            409,
            f"the {what} {spec} changed since the service started and no longer loads "
            f"({str(exc).splitlines()[-1].strip()}); fix it and restart the service",
        ) from None
    if now.source == started.source and now.sha256 != started.sha256:
        raise HTTPException(
            409,
            f"the configured {what} {started.source} changed since the service started "
            f"(sha256 {started.sha256[:12]} -> {now.sha256[:12]}); restart the service to use it",
        )
    return now


def app_from_env() -> FastAPI:
    """For ``uvicorn kdtree_parity.service:app_from_env --factory``."""
    return create_app(ServiceSettings.from_env(os.environ))
