"""HTTP client for one inference target (SGLang's API): health wait, identity, greedy replay.

Retries, with exponential backoff (``backoff_s * 2**attempt``), happen only where a second try
can give a different answer: the connection failed or broke, the server or a load balancer in
front of it said 429 (too many requests), 502 (bad gateway) or 503 (starting or overloaded), or
-- if ``retry_on_timeout`` -- the request timed out (greedy /generate is idempotent). A
``Retry-After`` header is honoured: the next try waits at least that long. No wait is longer
than ``max_retry_delay_s``. When every try failed the last answer is recorded as before: a 503
as "unavailable", a 429 or 502 as the HTTP error it is. Any other HTTP status or a malformed body
is the target's answer and is recorded at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from kdtree_parity.chat import CHAT_PATH, build_chat_request, parse_chat_response
from kdtree_parity.corpus import CorpusEntry
from kdtree_parity.generation import Generation, MalformedResponse, parse_generate_response
from kdtree_parity.policy import ReplaySettings
from kdtree_parity.results import Outcome, RequestError

# The connection could not be made, or broke before a response arrived (server died mid-request).
_CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


class TargetUnavailable(RuntimeError):
    """A target did not become healthy before the deadline."""


class TargetRefused(TargetUnavailable):
    """A target answered its health check with a client error (e.g. 404): it is up, and it is
    not a server the gate can replay against. Waiting longer would change nothing."""

    def __init__(self, message: str, target: TargetClient) -> None:
        super().__init__(message)
        self.target = target


class TargetUnauthorized(TargetUnavailable):
    """A healthy target refused the gate's requests (HTTP 401/403): its bearer token is missing
    or not the one it wants. Configuration, not the build: the run cannot decide."""


# How often a wait for /health says what it is waiting for.
WAIT_NOTICE_S = 5.0
Notice = Callable[[str], None]

# Health answers that mean "not yet": starting (503), or asked too early / too often.
_HEALTH_NOT_YET = frozenset({408, 425, 429})
# /generate answers worth another try: rate limited, a gateway that could not reach the server,
# a server starting or overloaded.
RETRY_STATUSES = frozenset({429, 502, 503})


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a target (None when it can): an absolute http(s) URL with a host."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        return f"{url!r} is not a URL: {exc}"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return f"{url!r} is not an http:// or https:// URL with a host"
    return None


def build_generate_request(entry: CorpusEntry, replay: ReplaySettings) -> dict[str, Any]:
    """The exact /generate body sent to every target for ``entry`` (greedy, with logprobs)."""
    body: dict[str, Any] = {"text": entry.text} if entry.text is not None else {}
    if entry.input_ids is not None:
        body["input_ids"] = list(entry.input_ids)
    body["sampling_params"] = {
        "temperature": 0,
        "max_new_tokens": entry.max_new_tokens or replay.max_new_tokens,
    }
    body["return_logprob"] = True
    body["top_logprobs_num"] = replay.top_logprobs_num
    body["return_text_in_logprobs"] = True
    return body


GENERATE_PATH = "/generate"
# How each route's answer becomes a Generation.
_PARSERS = {GENERATE_PATH: parse_generate_response, CHAT_PATH: parse_chat_response}


def build_request(entry: CorpusEntry, replay: ReplaySettings) -> tuple[str, dict[str, Any]]:
    """(route, body) for ``entry``: ``messages`` go to /v1/chat/completions, the rest to
    /generate."""
    if entry.is_chat:
        return CHAT_PATH, build_chat_request(entry, replay)
    return GENERATE_PATH, build_generate_request(entry, replay)


class TargetClient:
    """One target URL; use as an async context manager."""

    def __init__(
        self,
        name: str,
        base_url: str,
        replay: ReplaySettings,
        bearer_token: str | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.replay = replay
        self.has_token = bool(bearer_token)  # the token itself lives only in the HTTP client
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(replay.timeout_s),
            limits=httpx.Limits(max_connections=replay.concurrency * 2),
        )
        # Held by the caller around generate(): the runner checks for an abort after acquiring
        # it, so queued requests are dropped instead of sent once a run has been stopped.
        self.slot = asyncio.Semaphore(replay.concurrency)

    async def __aenter__(self) -> TargetClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def wait_healthy(
        self,
        deadline_s: float,
        poll_s: float = 0.5,
        notice: Notice | None = None,
        notice_every_s: float = WAIT_NOTICE_S,
    ) -> None:
        """Poll GET /health until 200; raise TargetUnavailable with the last cause at the deadline,
        or TargetRefused at once when the target answers with a client error. ``notice`` hears
        what is awaited, and why, every ``notice_every_s`` seconds of waiting."""
        start = time.monotonic()
        end = start + deadline_s
        next_notice = start + notice_every_s
        last = "no answer yet"
        while True:
            try:
                resp = await self._http.get("/health", timeout=min(10.0, self.replay.timeout_s))
                if resp.status_code == 200:
                    return
                if 400 <= resp.status_code < 500 and resp.status_code not in _HEALTH_NOT_YET:
                    raise TargetRefused(
                        f"{self.name} ({self.base_url}) answered GET /health with HTTP "
                        f"{resp.status_code}: not an inference server the gate can replay against",
                        self,
                    )
                last = f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if now >= end:
                raise TargetUnavailable(
                    f"{self.name} ({self.base_url}) not healthy after {deadline_s:g}s: {last}"
                )
            if notice is not None and now >= next_notice:
                notice(
                    f"waiting for {self.name} ({self.base_url}) to be healthy: {last} "
                    f"({now - start:.0f}s of {deadline_s:g}s)"
                )
                next_notice = now + notice_every_s
            await asyncio.sleep(poll_s)

    async def check_access(self) -> None:
        """Raise TargetUnauthorized when the target refuses the gate (GET /model_info answers
        401 or 403; /health is open on SGLang even with --api-key). Other answers pass: what
        they mean is recorded by ``identity`` and the replay."""
        try:
            resp = await self._http.get("/model_info", timeout=min(10.0, self.replay.timeout_s))
        except httpx.HTTPError:
            return
        if resp.status_code in (401, 403):
            variable = f"KDTREE_PARITY_{self.name.upper()}_TOKEN"
            why = (
                "it does not accept the bearer token it was given"
                if self.has_token
                else f"it requires a bearer token: set {variable} or {variable}_FILE"
            )
            raise TargetUnauthorized(
                f"{self.name} ({self.base_url}) refused the gate with HTTP {resp.status_code}: "
                + why
            )

    async def identity(self) -> dict[str, Any]:
        """What the target says it is (GET /model_info); an error is recorded, not raised."""
        try:
            resp = await self._http.get("/model_info", timeout=min(10.0, self.replay.timeout_s))
            if resp.status_code == 200 and isinstance(resp.json(), dict):
                return resp.json()
            return {"error": f"/model_info answered HTTP {resp.status_code}"}
        except (httpx.HTTPError, ValueError) as exc:
            return {"error": f"/model_info failed: {type(exc).__name__}: {exc}"}

    def retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait before retry ``attempt`` (1, 2, ...): the doubled backoff, or longer if the
        server asked for longer, never more than ``max_retry_delay_s``."""
        backoff = self.replay.backoff_s * 2 ** (attempt - 1)
        return min(self.replay.max_retry_delay_s, max(backoff, retry_after or 0.0))

    async def generate(self, body: dict[str, Any], path: str = GENERATE_PATH) -> Outcome:
        """POST ``path`` (/generate or /v1/chat/completions) with retries; never raises for
        target failures. Hold ``slot``."""
        parse: Callable[[Any], Generation] = _PARSERS[path]
        started = time.monotonic()
        attempts = 0
        error: RequestError | None = None
        asked_wait: float | None = None  # the last answer's Retry-After
        for attempt in range(self.replay.retries + 1):
            if attempt:
                await asyncio.sleep(self.retry_delay(attempt, asked_wait))
            attempts += 1
            asked_wait = None
            try:
                resp = await self._http.post(path, json=body)
            except httpx.TimeoutException as exc:
                kind = "connect" if isinstance(exc, httpx.ConnectTimeout) else "timeout"
                error = RequestError(kind, f"{type(exc).__name__} after {self.replay.timeout_s:g}s")
                if kind == "timeout" and not self.replay.retry_on_timeout:
                    break
                continue
            except _CONNECTION_ERRORS as exc:
                error = RequestError("connect", f"{type(exc).__name__}: {exc}")
                continue
            if resp.status_code in RETRY_STATUSES:
                code = resp.status_code
                kind = "unavailable" if code == 503 else "http"
                detail = f": {resp.text[:500]}" if resp.text else ""
                error = RequestError(kind, f"HTTP {code}{detail}", code)
                asked_wait = retry_after_s(resp.headers.get("retry-after"))
                continue
            if resp.status_code != 200:
                error = RequestError(
                    "http", f"HTTP {resp.status_code}: {resp.text[:500]}", resp.status_code
                )
                break
            try:
                generation = parse(resp.json())
            except (MalformedResponse, ValueError) as exc:
                error = RequestError("malformed", str(exc)[:500], resp.status_code)
                break
            return Outcome(generation, None, attempts, time.monotonic() - started)
        return Outcome(None, error, attempts, time.monotonic() - started)
