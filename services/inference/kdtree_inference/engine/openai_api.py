"""The OpenAI-compatible routes in SGLang 0.5.23's shapes: /v1/models, /v1/completions and
/v1/chat/completions, each with ``"stream": true`` as server-sent events ending in ``[DONE]``.

Shapes follow sglang/srt/entrypoints/openai (protocol.py, serving_completions.py,
serving_chat.py): the same field names, finish reasons (``stop``/``length`` plus
``matched_stop``), usage, chat logprobs as ``{"content": [{token, bytes, logprob,
top_logprobs}]}``, and SGLang's extensions ``return_token_ids`` (``prompt_token_ids``,
``response_token_ids``), ``return_meta_info`` (the native ``meta_info``: logprob triples and the
speculative counts), ``return_output_ids_in_sglext`` and ``return_spec_tokens_details``
(``sglext``). A chat request is rendered with the reference model's template (``chat``), then
served like any prompt, so greedy chat equals greedy /generate on the rendered text.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .api import SSE_DONE, EngineAPI, Serving, StreamFailed, sse_event
from .chat import ChatError, render_chat
from .protocol import (
    ChatCompletionRequestModel,
    CompletionRequestModel,
    GenerateRequestModel,
    RequestError,
    StreamOptionsModel,
    build_requests,
)
from .scheduler import GenerationRequest

MAX_TOP_LOGPROBS = 20  # OpenAI's limit

router = APIRouter()


# ---- building blocks --------------------------------------------------------------------------
def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """SGLang's ``UsageInfo`` as it serialises."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def _finish(meta: dict[str, Any]) -> tuple[str | None, Any]:
    reason = meta.get("finish_reason") or {}
    return reason.get("type"), reason.get("matched")


def _token_bytes(token_id: int, text: str | None) -> list[int]:
    # A byte token's true byte: its display text may be U+FFFD (part of a character).
    return [token_id] if 0 <= token_id < 256 else list((text or "").encode())


def chat_logprobs(meta: dict[str, Any]) -> dict[str, Any]:
    """``{"content": [...]}`` from a native ``meta_info`` (``_build_token_logprobs_from_raw``)."""
    tops = meta.get("output_top_logprobs") or []
    content = []
    for i, (logprob, token_id, text) in enumerate(meta["output_token_logprobs"]):
        row = tops[i] if i < len(tops) and tops[i] is not None else []
        content.append(
            {
                "token": text,
                "bytes": _token_bytes(token_id, text),
                "logprob": logprob,
                "top_logprobs": [
                    {"token": t_text, "bytes": _token_bytes(t_id, t_text), "logprob": t_lp}
                    for t_lp, t_id, t_text in row
                ],
            }
        )
    return {"content": content}


def completion_logprobs(meta: dict[str, Any], text_offset: int) -> dict[str, Any]:
    """OpenAI completions ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``) from a native ``meta_info``."""
    tokens = [text for _, _, text in meta["output_token_logprobs"]]
    offsets, at = [], text_offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": [lp for lp, _, _ in meta["output_token_logprobs"]],
        "tokens": tokens,
        "top_logprobs": [
            {text: lp for lp, _, text in row} for row in meta.get("output_top_logprobs") or []
        ],
    }


def _spec_tokens_details(meta: dict[str, Any]) -> dict[str, Any] | None:
    """SGLang's ``SpecTokensDetails`` from ``meta_info`` (None without speculative counts)."""
    if "spec_verify_ct" not in meta:
        return None
    return {
        "spec_accept_rate": meta["spec_accept_rate"],
        "spec_accept_length": meta["spec_accept_length"],
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": meta["spec_num_correct_drafts"],
        "spec_num_proposed_drafts": meta["spec_num_proposed_drafts"],
        "spec_verify_ct": meta["spec_verify_ct"],
        "spec_correct_drafts_histogram": [],
        "spec_cap_lens_histogram": [],
    }


def _one_request(api: EngineAPI, body: dict[str, Any]) -> GenerationRequest:
    requests, _ = build_requests(
        GenerateRequestModel.model_validate(body), api.engine.config, api.engine.tokenizer
    )
    return requests[0]


def _include_usage(options: StreamOptionsModel | None) -> tuple[bool, bool]:
    if options is None:
        return False, False
    return bool(options.include_usage), bool(options.continuous_usage_stats)


def _streaming(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    """SSE of ``chunks``, then ``[DONE]``; a failure after the 200 is an error event."""

    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield sse_event(chunk)
        except StreamFailed as exc:
            yield sse_event({"error": {"message": str(exc), "code": 400}})
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream")


# ---- /v1/models -------------------------------------------------------------------------------
@router.get("/v1/models")
async def models(api: Serving) -> dict[str, Any]:
    """503 while the engine starts: clients (sglang.bench_serving) poll it for readiness."""
    cfg = api.engine.config
    return {
        "object": "list",
        "data": [
            {
                "id": cfg.model_path,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": cfg.model_path,
                "parent": None,
                "max_model_len": cfg.model.max_position,
            }
        ],
    }


# ---- /v1/completions --------------------------------------------------------------------------
@router.post("/v1/completions")
async def completions(api: Serving, oa: CompletionRequestModel, request: Request) -> Response:
    if oa.n != 1 or oa.echo:
        raise RequestError("n > 1 and echo are not supported by the reference engine")
    if oa.logprobs is not None and not 0 <= oa.logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {oa.logprobs}")
    prompt = oa.prompt
    is_text = isinstance(prompt, str) or (
        isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str)
    )
    sampling: dict[str, Any] = {
        "max_new_tokens": oa.max_tokens,
        "temperature": oa.temperature,
        "top_p": oa.top_p,
        "stop": oa.stop,
        "ignore_eos": oa.ignore_eos,
        "sampling_seed": oa.seed,
    }
    if oa.top_k is not None:
        sampling["top_k"] = oa.top_k
    body = GenerateRequestModel.model_validate(
        {
            ("text" if is_text else "input_ids"): prompt,
            "sampling_params": sampling,
            "return_logprob": oa.logprobs is not None,
            "top_logprobs_num": oa.logprobs or 0,
            "return_text_in_logprobs": True,
        }
    )
    requests, is_batch = build_requests(body, api.engine.config, api.engine.tokenizer)
    model = oa.model or api.engine.config.model_path
    if oa.stream:
        if is_batch:
            raise RequestError("stream is supported for single prompts only")
        return _streaming(_completion_chunks(api, oa, requests[0], model, request))
    outputs = [
        api.output(req, res, with_text=True)
        for req, res in zip(requests, await api.run(requests, request), strict=True)
    ]
    choices = []
    for i, (req, out) in enumerate(zip(requests, outputs, strict=True)):
        reason, matched = _finish(out["meta_info"])
        choice = {
            "index": i,
            "text": out["text"],
            "logprobs": completion_logprobs(out["meta_info"], 0) if req.return_logprob else None,
            "finish_reason": reason,
            "matched_stop": matched,
        }
        if oa.return_token_ids:
            choice |= {"token_ids": out["output_ids"], "prompt_token_ids": req.input_ids}
        choices.append(choice)
    return JSONResponse(
        {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": _usage(
                sum(o["meta_info"]["prompt_tokens"] for o in outputs),
                sum(o["meta_info"]["completion_tokens"] for o in outputs),
            ),
            "metadata": {"weight_version": outputs[0]["meta_info"]["weight_version"]},
        }
    )


async def _completion_chunks(
    api: EngineAPI,
    oa: CompletionRequestModel,
    req: GenerationRequest,
    model: str,
    client: Request,
) -> AsyncIterator[dict[str, Any]]:
    """``CompletionStreamResponse`` chunks as serving_completions streams them."""
    chunk_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    include_usage, continuous = _include_usage(oa.stream_options)
    sent_text = 0
    meta: dict[str, Any] = {}
    async for out in api.stream_outputs(req, True, client, incremental=True):
        meta = out["meta_info"]
        reason, matched = _finish(meta)
        if not out["text"] and not out["output_ids"] and reason is None:
            continue
        choice = {
            "index": 0,
            "text": out["text"],
            "logprobs": completion_logprobs(meta, sent_text) if req.return_logprob else None,
            "finish_reason": reason,
            "matched_stop": matched,
        }
        if oa.return_token_ids:
            choice["token_ids"] = out["output_ids"]
        sent_text += len(out["text"])
        chunk = {
            "id": chunk_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage(meta["prompt_tokens"], meta["completion_tokens"])
            if continuous
            else None,
        }
        yield chunk
    if include_usage and meta.get("finish_reason"):
        yield {
            "id": chunk_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _usage(meta["prompt_tokens"], meta["completion_tokens"]),
        }


# ---- /v1/chat/completions ---------------------------------------------------------------------
def _chat_request(api: EngineAPI, chat: ChatCompletionRequestModel) -> GenerationRequest:
    refused = chat.unsupported()
    if refused:
        raise RequestError(f"{refused} not supported by the reference engine")
    if chat.top_logprobs is not None:
        if not chat.logprobs:
            raise RequestError("top_logprobs requires logprobs to be true")
        if not 0 <= chat.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {chat.top_logprobs}"
            )
    try:
        text = render_chat(chat.messages)
    except ChatError as exc:
        raise RequestError(str(exc)) from None
    cfg, tokenizer = api.engine.config, api.engine.tokenizer
    input_ids = tokenizer.encode(text)
    max_new = chat.max_completion_tokens or chat.max_tokens
    if max_new is None:  # as SGLang: as much as the context and the server's limit allow
        max_new = max(1, min(cfg.max_new_tokens_limit, cfg.model.max_position - 1 - len(input_ids)))
    body: dict[str, Any] = {
        "input_ids": input_ids,
        "sampling_params": chat.sampling_params(max_new),
        "return_logprob": chat.logprobs or chat.return_meta_info,
        "top_logprobs_num": chat.top_logprobs or 0,
    }
    if chat.rid is not None:
        body["rid"] = chat.rid
    return _one_request(api, body)


@router.post("/v1/chat/completions")
async def chat_completions(
    api: Serving, chat: ChatCompletionRequestModel, request: Request
) -> Response:
    req = _chat_request(api, chat)
    if chat.stream:
        if chat.return_token_ids or chat.return_meta_info:
            # As SGLang: these need the whole answer.
            raise RequestError(
                "return_token_ids and return_meta_info are not supported with streaming"
            )
        return _streaming(_chat_chunks(api, chat, req, request))
    (res,) = await api.run([req], request)
    out = api.output(req, res, with_text=True)
    meta = out["meta_info"]
    reason, matched = _finish(meta)
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": out["text"], "reasoning_content": None},
        "logprobs": chat_logprobs(meta) if chat.logprobs else None,
        "finish_reason": reason,
        "matched_stop": matched,
    }
    if chat.return_prompt_token_ids or chat.return_token_ids:
        choice["prompt_token_ids"] = req.input_ids
    if chat.return_token_ids:
        choice["response_token_ids"] = out["output_ids"]
    if chat.return_meta_info:
        choice["meta_info"] = meta
    response: dict[str, Any] = {
        "id": meta["id"],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [choice],
        "usage": _usage(meta["prompt_tokens"], meta["completion_tokens"]),
        "metadata": {"weight_version": meta["weight_version"]},
    }
    sglext = {}
    if chat.return_spec_tokens_details and (spec := _spec_tokens_details(meta)):
        sglext["spec_tokens_details"] = spec
    if chat.return_output_ids_in_sglext:
        sglext["output_ids"] = [out["output_ids"]]
    if sglext:
        response["sglext"] = sglext
    return JSONResponse(response)


async def _chat_chunks(
    api: EngineAPI, chat: ChatCompletionRequestModel, req: GenerationRequest, client: Request
) -> AsyncIterator[dict[str, Any]]:
    """``ChatCompletionStreamResponse`` chunks as serving_chat streams them: the role first,
    then content deltas, then the finish reason, then (``include_usage``) the usage."""
    include_usage, continuous = _include_usage(chat.stream_options)
    created = int(time.time())

    def chunk(meta: dict[str, Any], choices: list[dict[str, Any]], usage: Any = None) -> dict:
        return {
            "id": meta["id"],
            "object": "chat.completion.chunk",
            "created": created,
            "model": chat.model,
            "choices": choices,
            "usage": usage,
        }

    def choice(delta: dict[str, Any], **fields: Any) -> dict[str, Any]:
        return {
            "index": 0,
            "delta": {"role": None, "content": None, "reasoning_content": None} | delta,
            "logprobs": fields.get("logprobs"),
            "finish_reason": fields.get("finish_reason"),
            "matched_stop": fields.get("matched_stop"),
        }

    meta: dict[str, Any] = {}
    output_ids: list[int] = []
    first = True
    async for out in api.stream_outputs(req, True, client, incremental=True):
        meta = out["meta_info"]
        output_ids += out["output_ids"]
        running = _usage(meta["prompt_tokens"], meta["completion_tokens"]) if continuous else None
        if first:
            first = False
            yield chunk(meta, [choice({"role": "assistant", "content": ""})], running)
        if out["text"] or out["output_ids"]:
            logprobs = chat_logprobs(meta) if chat.logprobs else None
            yield chunk(meta, [choice({"content": out["text"]}, logprobs=logprobs)], running)
    reason, matched = _finish(meta)
    if reason is None:  # the client went away
        return
    yield chunk(meta, [choice({}, finish_reason=reason, matched_stop=matched)])
    if chat.return_output_ids_in_sglext:
        extra = chunk(meta, [])
        extra["sglext"] = {"output_ids": [output_ids]}
        yield extra
    if include_usage:
        yield chunk(meta, [], _usage(meta["prompt_tokens"], meta["completion_tokens"]))
