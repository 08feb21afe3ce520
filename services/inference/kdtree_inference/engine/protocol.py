"""Request models with SGLang 0.5.23's field names, and their translation to engine requests.

Validation mirrors SGLang: ``sampling_params`` rejects unknown keys (SGLang's msgspec
SamplingParams does) and range-checks like ``SamplingParams.verify``. SGLang features the reference
engine does not implement (grammars, penalties, n > 1, ...) are refused when set to anything but
their default, with a message, instead of being silently ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .config import EngineConfig
from .scheduler import GenerationRequest
from .tokenizer import ByteTokenizer

TOP_K_ALL = 1 << 30  # SGLang's "no top-k" sentinel
_rid_counter = itertools.count()


class RequestError(ValueError):
    """A client error: answered with HTTP 400 and ``{"error": {"message": ...}}``."""


class SamplingParamsModel(BaseModel):
    """SGLang SamplingParams' API fields (same names and defaults)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    beam_width: int | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = None
    logit_bias: dict[str, float] | None = None
    # torch.Generator.manual_seed's range; anything wider would fail inside the engine.
    sampling_seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    custom_params: dict[str, Any] | None = None
    watermark: Any = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_mean_default(cls, data: Any) -> Any:
        # SGLang treats null as "use the default" for its non-optional fields.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k == "max_new_tokens"}
        return data


class GenerateRequestModel(BaseModel):
    """The subset of SGLang's GenerateReqInput this engine serves; other keys are ignored, as
    SGLang's own request model ignores keys it does not know (its sampling parameters, above,
    are strict in both)."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False


def _first_error(exc: ValidationError) -> str:
    return describe_errors(exc.errors())


def describe_errors(errors: Sequence[Any], body_prefix: bool = False) -> str:
    """One line for pydantic's first error, in this API's words. ``body_prefix``: FastAPI's
    request-body errors, whose locations start with ``"body"``."""
    err = errors[0]
    loc = tuple(err["loc"])[1:] if body_prefix else tuple(err["loc"])
    if err["type"] == "json_invalid":
        return f"request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}"
    if body_prefix and not loc:  # no body, null, or not an object
        return "request body must be a JSON object"
    where = ".".join(str(p) for p in loc) or "body"
    if err["type"] == "extra_forbidden":
        return f"unknown sampling parameter {where!r}"
    return f"{where}: {err['msg']}"


def parse_sampling_params(raw: dict[str, Any], vocab_size: int) -> SamplingParamsModel:
    try:
        sp = SamplingParamsModel.model_validate(raw)
    except ValidationError as exc:
        raise RequestError(_first_error(exc)) from None
    # Range checks in SamplingParams.verify's words.
    if sp.temperature < 0.0 or sp.temperature != sp.temperature or sp.temperature == float("inf"):
        raise RequestError(
            f"temperature must be a non-negative finite number, got {sp.temperature}."
        )
    if not 0.0 < sp.top_p <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {sp.top_p}.")
    if not 0.0 <= sp.min_p <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {sp.min_p}.")
    if sp.top_k < 1 and sp.top_k != -1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {sp.top_k}.")
    if sp.max_new_tokens is not None and sp.max_new_tokens < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {sp.max_new_tokens}.")
    if sp.stop_token_ids and any(not 0 <= t < vocab_size for t in sp.stop_token_ids):
        raise RequestError(f"stop_token_ids must be in [0, {vocab_size - 1}]")
    unsupported = {
        "stop_regex": sp.stop_regex is not None,
        "frequency_penalty": sp.frequency_penalty != 0.0,
        "presence_penalty": sp.presence_penalty != 0.0,
        "repetition_penalty": sp.repetition_penalty != 1.0,
        "min_new_tokens": sp.min_new_tokens != 0,
        "n": sp.n != 1,
        "beam_width": sp.beam_width is not None,
        "json_schema": sp.json_schema is not None,
        "regex": sp.regex is not None,
        "ebnf": sp.ebnf is not None,
        "structural_tag": sp.structural_tag is not None,
        "logit_bias": bool(sp.logit_bias),
        "custom_params": bool(sp.custom_params),
        "watermark": sp.watermark is not None,
    }
    refused = [name for name, is_set in unsupported.items() if is_set]
    if refused:
        raise RequestError(f"sampling parameter(s) {refused} not supported by the reference engine")
    return sp


def _per_item(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise RequestError(f"{name} has {len(value)} entries for a batch of {count}")
        return value
    return [value] * count


def _prompts(req: GenerateRequestModel, tokenizer: ByteTokenizer) -> tuple[list[list[int]], bool]:
    """The body's prompts as token ids, and whether the body was a batch."""
    if (req.text is None) == (req.input_ids is None):
        raise RequestError("Either text or input_ids should be provided (exactly one).")
    if req.text is not None:
        is_batch = isinstance(req.text, list)
        texts = req.text if is_batch else [req.text]
        return [tokenizer.encode(t) for t in texts], is_batch
    is_batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
    return (req.input_ids if is_batch else [req.input_ids]), is_batch


def _check_prompt(prompt: list[int], config: EngineConfig) -> None:
    if not prompt:
        raise RequestError("the prompt is empty")
    if len(prompt) > config.max_prompt_tokens:
        raise RequestError(
            f"prompt has {len(prompt)} tokens, the limit is {config.max_prompt_tokens}"
        )
    vocab = config.model.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise RequestError(f"input_ids must be in [0, {vocab - 1}]")


def _max_new_tokens(requested: int | None, prompt_len: int, config: EngineConfig) -> int:
    """The generation length: the one asked for (or the limit), within the limit and context."""
    max_new = requested if requested is not None else config.max_new_tokens_limit
    if max_new > config.max_new_tokens_limit:
        raise RequestError(
            f"max_new_tokens={max_new} exceeds the limit of {config.max_new_tokens_limit}"
        )
    if prompt_len + max_new >= config.model.max_position:
        raise RequestError(
            f"prompt + max_new_tokens = {prompt_len + max_new} exceeds the model's context "
            f"of {config.model.max_position}"
        )
    return max_new


def _request_id(req: GenerateRequestModel, rids: list[Any] | None, i: int, count: int) -> str:
    if rids is not None:
        return rids[i]
    if req.rid is not None:
        return req.rid if count == 1 else f"{req.rid}_{i}"
    return f"req-{next(_rid_counter)}"


def build_requests(
    req: GenerateRequestModel, config: EngineConfig, tokenizer: ByteTokenizer
) -> tuple[list[GenerationRequest], bool]:
    """Engine requests for one /generate body, and whether the body was a batch."""
    prompts, is_batch = _prompts(req, tokenizer)
    count = len(prompts)
    if count == 0:
        raise RequestError("empty batch")
    if count > config.max_batch_request:
        raise RequestError(
            f"batch of {count} prompts exceeds the limit of {config.max_batch_request}"
        )
    params = _per_item(req.sampling_params or {}, count, "sampling_params")
    rids = _per_item(req.rid, count, "rid") if isinstance(req.rid, list) else None
    want_logprob = _per_item(req.return_logprob or False, count, "return_logprob")
    start_lens = _per_item(
        req.logprob_start_len if req.logprob_start_len is not None else -1,
        count,
        "logprob_start_len",
    )
    top_nums = _per_item(req.top_logprobs_num or 0, count, "top_logprobs_num")
    vocab = config.model.vocab_size
    out = []
    for i, prompt in enumerate(prompts):
        _check_prompt(prompt, config)
        sp = parse_sampling_params(params[i], vocab)
        max_new = _max_new_tokens(sp.max_new_tokens, len(prompt), config)
        top_n = int(top_nums[i])
        if not 0 <= top_n <= vocab:
            raise RequestError(f"top_logprobs_num must be in [0, {vocab}], got {top_n}")
        start = int(start_lens[i])
        if want_logprob[i] and start > len(prompt):
            raise RequestError(
                f"logprob_start_len={start} is higher than the number of input tokens {len(prompt)}"
            )
        stops = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
        out.append(
            GenerationRequest(
                rid=_request_id(req, rids, i, count),
                input_ids=list(prompt),
                max_new_tokens=max_new,
                temperature=sp.temperature,
                top_k=-1 if sp.top_k >= TOP_K_ALL else sp.top_k,
                top_p=sp.top_p,
                min_p=sp.min_p,
                ignore_eos=sp.ignore_eos,
                stop_strs=stops,
                stop_token_ids=set(sp.stop_token_ids or []),
                no_stop_trim=sp.no_stop_trim,
                skip_special_tokens=sp.skip_special_tokens,
                return_logprob=bool(want_logprob[i]),
                top_logprobs_num=top_n if want_logprob[i] else 0,
                # -1 = output logprobs only (SGLang resolves it to len(input_ids)).
                logprob_start_len=start if start >= 0 else -1,
                sampling_seed=sp.sampling_seed,
            )
        )
    return out, is_batch


class StreamOptionsModel(BaseModel):
    """OpenAI ``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(extra="ignore")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class CompletionRequestModel(BaseModel):
    """OpenAI /v1/completions (the fields a plain client sends)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    logprobs: int | None = None
    echo: bool = False
    stream: bool = False
    seed: int | None = None
    ignore_eos: bool = False
    stream_options: StreamOptionsModel | None = None
    return_token_ids: bool = False


class ChatCompletionRequestModel(BaseModel):
    """OpenAI /v1/chat/completions with SGLang 0.5.23's extensions that this engine serves
    (``ChatCompletionRequest`` in sglang/srt/entrypoints/openai/protocol.py; same names and
    defaults). Keys it does not know are ignored, as SGLang's model ignores them; features the
    engine does not implement (tools, response formats, penalties, ...) are refused when set."""

    model_config = ConfigDict(extra="ignore")

    messages: list[dict[str, Any]]
    model: str = "default"
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None  # None: 1.0, OpenAI's and SGLang's default
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptionsModel | None = None
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float | None = None
    min_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    regex: str | None = None
    ebnf: str | None = None
    rid: str | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    continue_final_message: bool = False
    # SGLang's switches for returning ids and its raw meta_info alongside the OpenAI fields.
    return_token_ids: bool = False
    return_prompt_token_ids: bool = False
    return_meta_info: bool = False
    return_output_ids_in_sglext: bool = False
    return_spec_tokens_details: bool = False

    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        """SGLang ``sampling_params`` for this request (``ChatCompletionRequest.to_sampling_params``'s
        mapping; unset temperature, top_p, top_k, min_p take OpenAI's defaults)."""
        return {
            "max_new_tokens": max_new_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": -1 if self.top_k is None else self.top_k,
            "min_p": 0.0 if self.min_p is None else self.min_p,
            "min_new_tokens": self.min_tokens,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "n": self.n,
            "no_stop_trim": self.no_stop_trim,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": 1.0
            if self.repetition_penalty is None
            else self.repetition_penalty,
            "logit_bias": self.logit_bias,
            "regex": self.regex,
            "ebnf": self.ebnf,
            "sampling_seed": self.seed,
        }

    def unsupported(self) -> list[str]:
        """Set fields the reference engine cannot honour (refused with 400)."""
        return [
            name
            for name, is_set in {
                "tools": bool(self.tools),
                "response_format": self.response_format is not None
                and self.response_format.get("type") not in (None, "text"),
                "continue_final_message": self.continue_final_message,
            }.items()
            if is_set
        ]
