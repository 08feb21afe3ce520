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
import collections
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar, get_args

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kdtree_parity.compare import DivergenceClass
from kdtree_parity.corpus import BUILTIN_CORPORA, CorpusError, load_corpus
from kdtree_parity.logs import PROGRESS_EVERY_S, event
from kdtree_parity.policy import PolicyError, load_policy
from kdtree_parity.report import build_report, render_html
from kdtree_parity.results import PromptResult
from kdtree_parity.runner import PreparedRun, RunRefused, execute_run, prepare_run, start_run
from kdtree_parity.settings import ParitySettings, SettingsError, load_settings, target_tokens
from kdtree_parity.store import (
    FINAL_STATUSES,
    AsyncStore,
    LeaseLost,
    PairBusy,
    RunRecord,
    Store,
)
from kdtree_parity.targets import TARGET_ROLES, Targets
from kdtree_parity.yaml_load import YAMLError, load_yaml

log = logging.getLogger("kdtree_parity.service")

# Keys a caller might use to aim the service at its own hosts: refused with an explanation.
TARGET_KEYS = frozenset({"baseline", "candidate", "replica", "floor", "targets", "url", "urls"})
MAX_BODY_BYTES = 1 << 20  # a run request is a few dozen bytes; anything near this is abuse
SHOWN_CHARS = 80  # at most this much of a caller's value is quoted back in an error
P = ParamSpec("P")
T = TypeVar("T")


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


class _PairEntry(BaseModel):
    """One entry of the pairs file as written (``floor``: the A/A' target; ``*_image``: labels)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: str
    candidate: str
    replica: str | None = None
    floor: str | None = None
    baseline_image: str | None = None
    candidate_image: str | None = None
    replica_image: str | None = None
    floor_image: str | None = None

    def targets(self) -> Targets:
        images = {role: getattr(self, f"{role}_image") for role in TARGET_ROLES}
        return Targets.from_urls(
            self.baseline, self.candidate, self.replica, self.floor, images=images
        )


_PAIRS_FILE = TypeAdapter(Annotated[dict[str, _PairEntry], Field(min_length=1)])


def load_pairs(path: Path) -> dict[str, Targets]:
    """A YAML mapping ``name: {baseline: URL, candidate: URL, replica: URL?, floor: URL?,
    *_image: label?}`` (``floor``: the A/A' target)."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, YAMLError) as exc:
        raise ConfigurationError(f"{path}: cannot read the pairs file: {exc}") from None
    if isinstance(data, dict):  # YAML keys may be numbers: a pair's name is their text
        data = {str(name): spec for name, spec in data.items()}
    try:
        pairs = _PAIRS_FILE.validate_python(data)
    except ValidationError as exc:
        raise ConfigurationError(f"{path}: {_pairs_problem(exc.errors())}") from None
    return {name: spec.targets() for name, spec in pairs.items()}


def _pairs_problem(errors: list[ErrorDetails]) -> str:
    """The first broken pair's problem, in the words of the pairs file's format."""
    if any(len(e["loc"]) == 0 for e in errors):
        return "expected a non-empty mapping of pair name -> targets"
    name = errors[0]["loc"][0]
    mine = [e for e in errors if e["loc"][0] == name]
    if any(e["type"] in ("model_type", "missing") for e in mine):
        return f"pair {name!r} needs 'baseline' and 'candidate' URLs"
    unknown = sorted(str(e["loc"][1]) for e in mine if e["type"] == "extra_forbidden")
    if unknown:
        return f"pair {name!r} has unknown key(s) {unknown}"
    return f"pair {name!r} {mine[0]['loc'][1]}: {mine[0]['msg']}"


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
    # Bearer token by target (KDTREE_PARITY_<TARGET>_TOKEN[_FILE]), the same for every pair;
    # held for the HTTP clients only, never shown or stored.
    tokens: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, settings: ParitySettings) -> ServiceSettings:
        """The pairs file when one is configured, else one pair ``default`` from the URLs."""
        if settings.pairs:
            pairs = load_pairs(Path(settings.pairs))
        else:
            pairs = {"default": Targets.from_settings(settings)}
        try:
            tokens = target_tokens(settings)
        except SettingsError as exc:
            raise ConfigurationError(str(exc)) from None
        return cls(
            token=settings.token,
            tokens=tokens,
            pairs=pairs,
            corpus=settings.corpus,
            policy=settings.policy,
            db=settings.db,
            out=settings.out,
            lease_s=settings.lease_s,
        )

    def check(self) -> PreparedRun:
        """The configured corpus and policy as they are now; ConfigurationError naming every
        problem a POST /runs would otherwise hit."""
        urls = {
            label: url
            for name, targets in self.pairs.items()
            for label, url in targets.labelled_urls(f"pair {name!r} ").items()
        }
        try:
            return prepare_run(self.corpus, self.policy, urls)
        except RunRefused as exc:
            raise ConfigurationError(
                "the parity service's configuration is unusable:\n" + "\n".join(exc.problems)
            ) from None


class RunRequest(BaseModel):
    """The body of ``POST /runs``: which configured pair, and optionally which corpus (the
    configured one, or a shipped name). Anything else is refused."""

    model_config = ConfigDict(extra="forbid")

    pair: str = Field("default", description="a configured pair's name")
    corpus: str = Field(
        "", description="a shipped corpus name or the configured corpus (when left out)"
    )

    def corpus_or(self, configured: str) -> str:
        """The corpus asked for; the configured one when the field was left out."""
        return self.corpus if "corpus" in self.model_fields_set else configured


def _request_problem(errors: list[ErrorDetails], pairs: list[str]) -> str:
    """Today's words for what is wrong with a run request, most telling first."""
    kinds = {e["type"] for e in errors}
    if "json_invalid" in kinds and any("recursion limit" in e["msg"] for e in errors):
        return "the request body is nested too deeply"
    if kinds & {"json_invalid", "model_type"}:
        return "the request body must be a JSON object"
    extra = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if aimed := sorted(TARGET_KEYS & set(extra)):
        return (
            f"refused: {', '.join(aimed)} cannot be set by a caller; targets come from the "
            f"service configuration (pairs: {', '.join(sorted(pairs))})"
        )
    if extra:
        return f"unknown field(s) {extra}; allowed: {sorted(RunRequest.model_fields)}"
    key, value = errors[0]["loc"][0], errors[0]["input"]
    return f"{key!r} must be a string (a name), not {_shown(value)}"


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
        # The series the alert rules watch for increases exist at 0 from the start: Prometheus
        # sees no increase in a counter whose first sample is already above 0.
        for status in FINAL_STATUSES:
            self.runs.labels(status)
        for klass in PROMPT_CLASSES:
            self.prompts.labels(klass)
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
        self.prompts.labels(prompt_class(result)).inc()


PROMPT_CLASSES = ("exact", *get_args(DivergenceClass), "error")


def prompt_class(result: PromptResult) -> str:
    """The candidate-vs-baseline class of one prompt: exact, a divergence class, or error."""
    c = result.candidate
    return "error" if c is None else "exact" if c.exact else c.divergence_class or "hard"


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
        "targets": record.target_urls(),
        "corpus": {"source": record.corpus_source, "sha256": record.corpus_sha256},
        "policy": {"source": record.policy_source, "sha256": record.policy_sha256},
        "links": {
            "self": f"/runs/{record.id}",
            "report_json": f"/runs/{record.id}/report.json",
            "report_html": f"/runs/{record.id}/report.html",
        },
    }


@dataclass
class ServiceState:
    """What the endpoints share while the service runs (``lifespan`` makes it)."""

    settings: ServiceSettings
    started: PreparedRun  # the configured corpus and policy as checked at start
    store: AsyncStore  # the endpoints'
    run_store: (
        AsyncStore  # the runs' (a write may wait on another process's lock: not the endpoints')
    )
    live: _Live
    metrics: _Metrics


def service_state(request: Request) -> ServiceState:
    return request.state.service


State = Annotated[ServiceState, Depends(service_state)]
bearer = HTTPBearer(auto_error=False, description="KDTREE_PARITY_TOKEN")


def require_token(
    state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """Mutations need the configured token; without one configured they are all refused."""
    token = state.settings.token
    if not token:
        raise HTTPException(
            403, "mutating endpoints are disabled: the service has no KDTREE_PARITY_TOKEN"
        )
    given = "" if credentials is None else credentials.credentials
    if not secrets.compare_digest(given.encode(), token.encode()):
        raise HTTPException(
            401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )


async def run_request(
    request: Request, state: State, _: Annotated[None, Depends(require_token)]
) -> RunRequest:
    """The body as a RunRequest, read only once the caller is authorized; an empty body asks
    for the defaults. Refusals are 400s that say what to change."""
    raw = await request.body()
    try:
        return RunRequest.model_validate_json(raw if raw.strip() else b"{}")
    except ValidationError as exc:
        problem = _request_problem(exc.errors(), list(state.settings.pairs))
        raise HTTPException(400, problem) from None


async def run_record(run_id: str, state: State) -> RunRecord:
    try:
        return await state.store.call(Store.get_run, run_id)
    except KeyError:
        raise HTTPException(404, f"no run {_shown(run_id)}") from None


Record = Annotated[RunRecord, Depends(run_record)]
router = APIRouter()


@router.get("/health")
async def health(state: State) -> dict[str, Any]:
    return {"status": "ok", "running": len(state.live.tasks), "pairs": sorted(state.settings.pairs)}


@router.get("/metrics")
async def prometheus_metrics(state: State) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.post(
    "/runs",
    status_code=202,
    # The body is read by run_request (after the token check); its schema, for the docs:
    openapi_extra={
        "requestBody": {"content": {"application/json": {"schema": RunRequest.model_json_schema()}}}
    },
)
async def create_run(
    body: Annotated[RunRequest, Depends(run_request)], state: State
) -> JSONResponse:
    settings = state.settings
    if body.pair not in settings.pairs:
        raise HTTPException(404, f"no configured pair {_shown(body.pair)}")
    corpus_spec = body.corpus_or(settings.corpus)
    if corpus_spec != settings.corpus and corpus_spec not in BUILTIN_CORPORA:
        raise HTTPException(
            400, f"corpus must be the configured one or a shipped name {BUILTIN_CORPORA}"
        )
    targets = settings.pairs[body.pair]
    prepared = await run_in_threadpool(_prepare, state, corpus_spec, targets)
    try:
        run_id = await state.store.call(
            start_run,
            prepared.corpus,
            prepared.policy,
            targets,
            pair=body.pair,
            out_dir=settings.out,
            exclusive=True,
        )
    except PairBusy as exc:
        raise HTTPException(409, str(exc)) from None
    record = await state.store.call(Store.get_run, run_id)
    _launch(state, record)
    return JSONResponse(_run_json(record, state.live), status_code=202)


def _prepare(state: ServiceState, corpus_spec: str, targets: Targets) -> PreparedRun:
    """The run's corpus and policy as they are now (409 when a configured file changed since
    the start), checked like the configuration was (400)."""
    started = state.started
    corpus = _unchanged(corpus_spec, load_corpus, CorpusError, started.corpus, "corpus")
    policy = _unchanged(state.settings.policy, load_policy, PolicyError, started.policy, "policy")
    try:
        return prepare_run(corpus, policy, targets.labelled_urls())
    except RunRefused as exc:
        raise HTTPException(400, str(exc)) from None


class _RunEvents:
    """What one run of this process tells /metrics and the log (``logs``: run_started,
    run_progress at most every PROGRESS_EVERY_S, run_finished)."""

    def __init__(self, state: ServiceState, record: RunRecord) -> None:
        self.state, self.run_id = state, record.id
        self.started = self.last_logged = time.monotonic()
        self.classes: collections.Counter[str] = collections.Counter()
        self.request_errors = 0
        state.live.done[record.id] = 0
        state.metrics.running.inc()
        event(
            "run_started",
            run_id=record.id,
            pair=record.pair,
            prompts=record.prompts_total,
            corpus=record.corpus_source,
            corpus_sha256=record.corpus_sha256,
            policy=record.policy_source,
            targets=record.target_urls(),
        )

    def progress(self, done: int, total: int, result: PromptResult | None) -> None:
        self.state.live.done[self.run_id] = done
        if result is not None:
            self.state.metrics.record(result)
            self.classes[prompt_class(result)] += 1
            self.request_errors += sum(o.error is not None for o in result.outcomes.values())
        now = time.monotonic()
        if done == total or now - self.last_logged >= PROGRESS_EVERY_S:
            self.last_logged = now
            event(
                "run_progress",
                run_id=self.run_id,
                done=done,
                total=total,
                classes=dict(self.classes),
                request_errors=self.request_errors,
            )

    async def finished(self, status: str) -> None:
        """Count the run's end and log it (its verdict, error and report, when it has them)."""
        self.state.metrics.running.dec()
        self.state.metrics.runs.labels(status).inc()
        self.state.live.tasks.pop(self.run_id, None)
        try:
            await self._log_end(status)
        except Exception:  # the run's end is stored either way; only its log line is lost
            log.exception("run %s: could not log its end", self.run_id)

    async def _log_end(self, status: str) -> None:
        verdict, error, report = None, None, None
        if status != "interrupted":  # else the store may be closing with the service
            final = await self.state.run_store.call(Store.get_run, self.run_id)
            verdict, error = final.verdict, final.error
            if final.out_dir:
                path = Path(final.out_dir) / self.run_id / "report.json"
                report = str(path) if path.is_file() else None
        event(
            "run_finished",
            run_id=self.run_id,
            status=status,
            verdict=verdict["status"] if verdict else None,
            reasons=[
                {key: r[key] for key in ("rule", "outcome", "message")}
                for r in (verdict or {}).get("reasons", [])
                if r["outcome"] != "pass"
            ],
            error=error,
            report=report,
            duration_s=round(time.monotonic() - self.started, 3),
        )


def _launch(state: ServiceState, record: RunRecord) -> None:
    """Execute the recorded run as a task of this process, counted in /metrics and logged as
    events (``_RunEvents``)."""
    events = _RunEvents(state, record)
    task = asyncio.create_task(_execute(state, record.id, events), name=f"parity-run-{record.id}")
    state.live.tasks[record.id] = task


async def _execute(state: ServiceState, run_id: str, events: _RunEvents) -> None:
    status = "error"
    try:
        outcome = await execute_run(
            state.run_store, run_id, progress=events.progress, tokens=state.settings.tokens
        )
        status = outcome.status
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    except LeaseLost:
        status = "interrupted"  # taken over by another process; logged by the runner
    except Exception:
        log.exception("run %s crashed", run_id)
    finally:
        await events.finished(status)


@router.get("/runs")
async def list_runs(state: State, limit: int = 50) -> list[dict[str, Any]]:
    records = await state.store.call(Store.list_runs, min(max(limit, 1), 500))
    return [_run_json(r, state.live) for r in records]


@router.get("/runs/{run_id}")
async def get_run(record: Record, state: State) -> dict[str, Any]:
    return _run_json(record, state.live)


@router.get("/runs/{run_id}/report.json")
async def report_json(record: Record, state: State) -> JSONResponse:
    report = await state.store.call(build_report, record.id)
    return JSONResponse(report.model_dump(mode="json"))


@router.get("/runs/{run_id}/report.html")
async def report_html(record: Record, state: State) -> HTMLResponse:
    report = await state.store.call(build_report, record.id)
    return HTMLResponse(await run_in_threadpool(render_html, report))


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


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, ServiceState]]:
    """Open the stores; on the way out cancel this process's runs (recorded as interrupted).
    Runs another process left running stay as they are: each reads as interrupted only once
    its own lease expired (store.py), whoever starts or restarts meanwhile."""
    settings: ServiceSettings = app.state.settings
    run_store = AsyncStore(Store(settings.db, lease_s=settings.lease_s))
    try:
        store = AsyncStore(Store(settings.db, lease_s=settings.lease_s))
    except BaseException:
        run_store.close()
        raise
    state = ServiceState(settings, app.state.started, store, run_store, _Live(), _Metrics())
    try:
        yield {"service": state}
    finally:
        tasks = list(state.live.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        store.close()
        run_store.close()


def create_app(settings: ServiceSettings) -> FastAPI:
    """The service; ``settings`` are fixed for its lifetime and checked here (ConfigurationError).

    The configured corpus and policy files are hashed now: a run asked for after either file
    changed (or broke) is refused with 409, naming the change; restart the service to take it.
    """
    started = settings.check()
    app = FastAPI(title="kdtree parity sidecar", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.started = started
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.include_router(router)
    return app


def app_from_env() -> FastAPI:
    """For ``uvicorn kdtree_parity.service:app_from_env --factory``."""
    return create_app(ServiceSettings.from_settings(load_settings()))
