"""HTTP API in SGLang 0.5.23's shapes: /generate, /health, /model_info, /metrics (the OpenAI
routes are in ``openai_api``).

Responses are built the way SGLang's TokenizerManager builds them (``meta_info`` keys, logprob
triples ``(logprob, token_id, text_or_None)``, finish reasons ``{"type": "length", "length": n}`` /
``{"type": "stop", "matched": ...}``); errors are ``{"error": {"message": ...}}`` with 400 for
client mistakes and 503 while the engine is not ready, never an unhandled 500.

A request whose client goes away is aborted in the scheduler, as SGLang aborts on disconnect:
a non-streaming request's connection is polled every ``DISCONNECT_POLL_S``, and a stream is
aborted when its generator is cancelled or its client is gone. Aborted requests are counted in
``kdtree_engine_aborted_requests_total`` and answered (to nobody) with 499.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import torch
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .chat import HF_TOKENIZER_DIR
from .protocol import (
    GenerateRequestModel,
    RequestError,
    build_requests,
    describe_errors,
)
from .scheduler import (
    Engine,
    EngineStepError,
    GenerationRequest,
    GenerationResult,
)

log = logging.getLogger("kdtree_inference.engine.api")


GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
DISCONNECT_POLL_S = 0.25  # how often a waiting non-streaming request checks its client
CLIENT_CLOSED = 499  # nginx's "client closed request": what an aborted request is counted as
# meta_info lists that an incremental stream sends per segment (SGLang's
# _INCREMENTAL_STREAMING_META_INFO_KEYS that this engine produces).
INCREMENTAL_META_KEYS = ("output_token_logprobs", "output_top_logprobs")


class ClientGone(Exception):
    """The HTTP client disconnected; its requests were aborted."""


class NotReady(Exception):
    """The engine is starting or failed to start: answered with 503."""


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _unparsed_body(_request: Request, exc: HTTPException) -> JSONResponse:
    """FastAPI's own refusals (a body it could not parse, an unknown path) in this API's shape;
    a body that did not parse says why (FastAPI keeps the cause)."""
    message = str(exc.detail)
    if isinstance(exc.__cause__, RecursionError):
        message = "request body is nested too deeply"
    elif isinstance(exc.__cause__, UnicodeDecodeError):
        message = f"request body is not valid JSON: {exc.__cause__}"
    return _error(message, exc.status_code)


# What an exception that leaves a route is answered with (never an unhandled 500).
EXCEPTION_RESPONSES: dict[type[Exception], Any] = {
    # A body that does not fit its request model: a 400 in SGLang's words, as SGLang answers.
    RequestValidationError: lambda _request, exc: _error(
        describe_errors(exc.errors(), body_prefix=True)
    ),
    HTTPException: _unparsed_body,
    ClientGone: lambda _request, _exc: Response(status_code=CLIENT_CLOSED),
    NotReady: lambda _request, exc: _error(str(exc), 503),
    EngineStepError: lambda _request, exc: _error(str(exc), 500),
    # RequestError, or a request larger than the whole KV pool.
    ValueError: lambda _request, exc: _error(str(exc)),
}


class EngineAPI:
    """Binds an ``Engine`` to a FastAPI app; one instance per server process."""

    def __init__(self, engine: Engine, metrics: Any) -> None:
        self.engine = engine
        self.metrics = metrics
        self.server_id = uuid.uuid4().hex
        engine.step_listeners.append(metrics.on_verify_step)
        engine.step_listeners.append(self._publish_validation)
        self._validate_calls = 0
        self.app = FastAPI(title="kdtree reference engine", exception_handlers=EXCEPTION_RESPONSES)
        self.app.state.api = self
        self.app.add_middleware(_CountGenerationRequests, api=self)
        self.app.include_router(router)
        # Imported here: the OpenAI routes are built on this module's EngineAPI.
        from .openai_api import router as openai_router

        self.app.include_router(openai_router)

    def _publish_validation(self, *_step: object) -> None:
        """validate: publish the comparison the verify step just made (scheduler thread)."""
        backend = self.engine.model.attention if self.engine.model is not None else None
        if backend is None or backend.name != "validate":
            return
        calls, self._validate_calls = (
            backend.validate_calls - self._validate_calls,
            backend.validate_calls,
        )
        self.metrics.publish_validation(backend.take_window(), calls)

    # ---- response building ----------------------------------------------------------------
    def _logprob_triples(
        self, pairs: list[tuple[float | None, int]], with_text: bool
    ) -> list[list[Any]]:
        tok = self.engine.tokenizer
        return [[lp, t, tok.token_text(t) if with_text else None] for lp, t in pairs]

    def _meta_info(
        self, req: GenerationRequest, res: GenerationResult, with_text: bool
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": res.rid,
            "finish_reason": res.finish_reason,
            "prompt_tokens": res.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        }
        if req.return_logprob:
            meta["input_token_logprobs"] = self._logprob_triples(
                res.input_token_logprobs, with_text
            )
            meta["output_token_logprobs"] = self._logprob_triples(
                res.output_token_logprobs, with_text
            )
            meta["output_token_logprobs_length"] = len(res.output_token_logprobs)
            if req.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [
                    self._logprob_triples(top, with_text) if top else None
                    for top in res.input_top_logprobs
                ]
                meta["output_top_logprobs"] = [
                    self._logprob_triples(top, with_text) for top in res.output_top_logprobs
                ]
        completion = len(res.output_ids)
        meta |= {"reasoning_tokens": 0, "completion_tokens": completion, "cached_tokens": 0}
        if res.finish_reason is not None:
            meta["e2e_latency"] = res.e2e_latency
            # What SGLang 0.5.23 adds with --enable-metrics (ReqTimeStats.convert_to_output_meta_
            # info): time to first token and (completion - 1) / decode time.
            if res.first_token_latency > 0:
                meta["first_token_latency"] = res.first_token_latency
                decode_s = res.e2e_latency - res.first_token_latency
                if completion > 1 and decode_s > 0:
                    meta["decode_throughput"] = (completion - 1) / decode_s
            num_draft = self.engine.config.spec.num_draft_tokens
            # Same formulas as TokenizerManager._calculate_spec_decoding_metrics.
            if num_draft > 1 and res.spec_verify_ct > 0:
                proposed = res.spec_verify_ct * (num_draft - 1)
                meta["spec_accept_rate"] = res.spec_num_correct_drafts / proposed
                meta["spec_accept_length"] = completion / res.spec_verify_ct
                meta["spec_num_correct_drafts"] = res.spec_num_correct_drafts
                meta["spec_num_proposed_drafts"] = proposed
                meta["spec_verify_ct"] = res.spec_verify_ct
        return meta

    def output(self, req: GenerationRequest, res: GenerationResult, with_text: bool) -> dict:
        return {
            "text": res.text,
            "output_ids": list(res.output_ids),
            "meta_info": self._meta_info(req, res, with_text),
        }

    def _record(self, req: GenerationRequest, res: GenerationResult) -> None:
        attention = self.engine.config.attention
        self.metrics.prompt_tokens.labels(attention).inc(res.prompt_tokens)
        self.metrics.generation_tokens.labels(attention).inc(len(res.output_ids))
        self.metrics.latency.labels(attention).observe(res.e2e_latency)

    def abort(self, requests: list[GenerationRequest]) -> None:
        for req in requests:
            self.engine.abort(req)
        self.metrics.aborted.labels(self.engine.config.attention).inc(len(requests))

    async def run(
        self, requests: list[GenerationRequest], client: Request | None = None
    ) -> list[GenerationResult]:
        """Generate ``requests``; ClientGone (after aborting them) once ``client`` disconnects."""
        futures = [asyncio.wrap_future(self.engine.submit(r)) for r in requests]
        gathered = asyncio.gather(*futures, return_exceptions=True)
        while client is not None:
            done, _ = await asyncio.wait({gathered}, timeout=DISCONNECT_POLL_S)
            if done:
                break
            if await client.is_disconnected():
                self.abort(requests)
                raise ClientGone
        results = await gathered
        for outcome in results:
            if isinstance(outcome, BaseException):
                raise outcome
        for req, res in zip(requests, results, strict=True):
            self._record(req, res)
        return list(results)

    def check_ready(self) -> None:
        """Raise :class:`NotReady` unless the engine serves."""
        if self.engine.failed is not None:
            raise NotReady(f"engine failed to start: {self.engine.failed}")
        if not self.engine.ready.is_set():
            raise NotReady("engine is starting")

    def model_info(self) -> dict[str, Any]:
        cfg, engine = self.engine.config, self.engine
        return {
            "model_path": cfg.model_path,
            "served_model_name": cfg.model_path,
            "tokenizer_path": str(HF_TOKENIZER_DIR),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "safetensors" if cfg.weights_dir else "seeded",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "deepseek_v3",
            "architectures": ["DeepseekV3ForCausalLM"],
            # Not in SGLang: what this reference engine runs, for reports and the sidecar.
            "kdtree_engine": {
                "attention_backend": cfg.attention,
                "device": cfg.device,
                "dtype": cfg.dtype,
                # What the weights are: the safetensors file (path and sha256 of its bytes)
                # or, when seeded, the seed and the sha256 of the seeded model's config.
                "seed": None if cfg.weights_dir else cfg.model.seed,
                "weights_path": engine.weights_identity.get("path"),
                "weights_sha256": engine.weights_identity.get("sha256"),
                "num_layers": cfg.model.num_layers,
                "num_heads": cfg.model.num_heads,
                "hidden_size": cfg.model.hidden_size,
                "vocab_size": cfg.model.vocab_size,
                "speculative_num_draft_tokens": cfg.spec.num_draft_tokens,
                "speculative_topk": cfg.spec.topk,
                "fault_layer": cfg.fault_layer,
                "fault_scale": cfg.fault_scale,
                "injected_fault": (cfg.injected_fault.describe() if cfg.injected_fault else None),
                "attention_kv_splits": cfg.attention_kv_splits,
                # Options that change the numbers: a resumed run compares them with the start.
                "prefill_chunk": cfg.prefill_chunk,
                "max_batch_size": cfg.max_batch_size,
                "threads": torch.get_num_threads(),
                "decode_step_delay_s": cfg.decode_step_delay_s,
                # This process, not the build: a gate checks that its reference targets are
                # not the candidate behind another URL.
                "server_id": self.server_id,
            },
        }

    def render_metrics(self) -> str:
        """The Prometheus exposition, with the gauges read now."""
        engine, attention = self.engine, self.engine.config.attention
        self.metrics.ready.labels(attention).set(1.0 if engine.ready.is_set() else 0.0)
        self.metrics.running.labels(attention).set(engine.num_running)
        if engine.model is not None and attention == "validate":
            backend = engine.model.attention
            self.metrics.validate_calls.labels(attention).set(backend.validate_calls)
            self.metrics.validate_max_abs_diff.labels(attention).set(backend.validate_max_abs_diff)
        return self.metrics.render()

    async def generate(self, body: GenerateRequestModel, request: Request) -> Response:
        requests, is_batch = build_requests(body, self.engine.config, self.engine.tokenizer)
        with_text = body.return_text_in_logprobs
        if body.stream:
            if is_batch:
                raise RequestError("stream is supported for single prompts only")
            return self._stream(requests[0], with_text, request)
        results = await self.run(requests, request)
        outputs = [self.output(r, res, with_text) for r, res in zip(requests, results, strict=True)]
        return JSONResponse(outputs if is_batch else outputs[0])

    async def stream_outputs(
        self, req: GenerationRequest, with_text: bool, client: Request, incremental: bool
    ) -> AsyncIterator[dict]:
        """The outputs of one streamed request, /generate-shaped, the last one with its finish
        reason: with ``incremental`` each carries only the new text, ``output_ids`` and output
        logprobs (SGLang's --incremental-streaming-output), else the whole output so far.
        Ends early, without a final output, when the client goes away (the request is
        aborted, as it is when the consumer stops); :class:`StreamFailed` if generation fails."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        segments = _Segments(req, incremental)

        def on_progress(res: GenerationResult) -> None:
            snapshot = self.output(req, res, with_text)
            loop.call_soon_threadsafe(updates.put_nowait, snapshot)

        req.on_progress = on_progress
        future = asyncio.wrap_future(self.engine.submit(req))
        finished = False
        getter: asyncio.Future | None = None
        try:
            while True:
                getter = getter or asyncio.ensure_future(updates.get())
                done, _ = await asyncio.wait(
                    {getter, future},
                    timeout=DISCONNECT_POLL_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    if await client.is_disconnected():
                        return
                    continue
                if getter in done:
                    chunk, getter = getter.result(), None
                    if chunk["meta_info"]["finish_reason"] is None:
                        yield segments.next(chunk)
                        continue
                try:
                    res = await future
                except Exception as exc:
                    finished = True
                    raise StreamFailed(str(exc)) from exc
                finished = True
                self._record(req, res)
                yield segments.next(self.output(req, res, with_text), final=True)
                return
        finally:  # cancelled (the client went away) or returned early: stop the work
            if getter is not None:
                getter.cancel()
            if not finished and not future.done():
                self.abort([req])

    def _stream(
        self, req: GenerationRequest, with_text: bool, client: Request
    ) -> StreamingResponse:
        """SSE as SGLang streams /generate (see :meth:`stream_outputs`), then ``[DONE]``."""
        outputs = self.stream_outputs(
            req, with_text, client, self.engine.config.incremental_streaming_output
        )

        async def events() -> AsyncIterator[bytes]:
            try:
                async for output in outputs:
                    yield sse_event(output)
                    if output["meta_info"]["finish_reason"] is not None:
                        yield SSE_DONE
            except StreamFailed as exc:
                yield sse_event({"error": {"message": str(exc), "code": 400}})
                yield SSE_DONE

        return StreamingResponse(events(), media_type="text/event-stream")


def sse_event(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class StreamFailed(Exception):
    """Generation failed after a stream's 200 was sent: reported in the stream itself."""


# ---- routes -------------------------------------------------------------------------------
router = APIRouter()
# The dependencies are coroutines: plain functions would each take a trip through the thread pool.


async def engine_api(request: Request) -> EngineAPI:
    """The :class:`EngineAPI` the app was built by."""
    return request.app.state.api


async def serving_api(api: Annotated[EngineAPI, Depends(engine_api)]) -> EngineAPI:
    """The API of an engine that serves (503 while it does not)."""
    api.check_ready()
    return api


Serving = Annotated[EngineAPI, Depends(serving_api)]


@router.get("/health")
@router.get("/health_generate")
async def health(api: Serving) -> Response:
    return Response(status_code=200)


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(api: Annotated[EngineAPI, Depends(engine_api)]) -> dict:
    return api.model_info()


@router.get("/metrics")
async def metrics(api: Annotated[EngineAPI, Depends(engine_api)]) -> Response:
    return Response(api.render_metrics(), media_type="text/plain; version=0.0.4")


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(api: Serving, body: GenerateRequestModel, request: Request) -> Response:
    return await api.generate(body, request)


class _CountGenerationRequests:
    """Every answer of a generation endpoint is counted by its HTTP status, refusals too.

    Plain ASGI rather than ``@app.middleware("http")``: that wrapper stands between the handler
    and the server's ``receive``, and a handler polling ``request.is_disconnected()`` through it
    never sees its client go away."""

    def __init__(self, app: ASGIApp, api: EngineAPI) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                api = self.api
                api.metrics.requests.labels(api.engine.config.attention, message["status"]).inc()
            await send(message)

        await self.app(scope, receive, counted)


class _Segments:
    """Turns the cumulative outputs of one stream into what each event sends."""

    def __init__(self, req: GenerationRequest, incremental: bool) -> None:
        self.incremental = incremental
        self.sent_ids = 0
        self.sent_text = ""
        # Text not yet certain stays back: a stop string may still trim it, and a trailing
        # U+FFFD may be the start of a multi-byte character that the next token completes.
        self.hold = max((len(stop) for stop in req.stop_strs), default=1) - 1

    def next(self, output: dict, final: bool = False) -> dict:
        if not self.incremental:
            return output
        text = output["text"]
        if not final:
            text = text[: len(text) - self.hold] if self.hold else text
            text = text.rstrip("\ufffd")
        delta = text[len(self.sent_text) :] if text.startswith(self.sent_text) else ""
        self.sent_text += delta
        meta = dict(output["meta_info"])
        for key in INCREMENTAL_META_KEYS:
            if key in meta:
                meta[key] = meta[key][self.sent_ids :]
        ids = output["output_ids"][self.sent_ids :]
        self.sent_ids = len(output["output_ids"])
        return {"text": delta, "output_ids": ids, "meta_info": meta}
