"""One greedy generation as the sidecar sees it, parsed from SGLang's ``/generate`` response.

SGLang 0.5.23 (``srt/managers/tokenizer_manager.py``: ``detokenize_logprob_tokens`` and
``detokenize_top_logprobs_tokens``) answers a request with ``return_logprob: true,
top_logprobs_num: k`` with::

    {"text": "...", "output_ids": [int, ...],
     "meta_info": {"finish_reason": {"type": "stop"|"length"|"abort", ...} | null,
                   "output_token_logprobs": [[logprob, token_id, text|null], ...],
                   "output_top_logprobs": [[[logprob, token_id, text|null], ...] | null, ...]}}

When the request is finished ``meta_info`` also carries ``e2e_latency`` (seconds from receipt to
finish), and with ``--enable-metrics`` ``first_token_latency`` (time to first token) and
``decode_throughput`` (``(completion_tokens - 1) / (finish - first token)``, tokens/s;
``srt/observability/req_time_stats.py``). The reference engine sends all three. They are read
into ``Timing`` and shown in the report as what the target says about itself; the gate's speed
rule uses the sidecar's own clock instead. A missing or non-numeric timing field is not an error.
``meta_info.prompt_tokens`` (the prompt's length in the target's own tokens) places the answer in
a context-length bucket, and with speculative decoding ``spec_verify_ct`` (verify forwards) with
``completion_tokens`` gives the accept length, tokens per verify step
(``srt/managers/scheduler_output_processor_mixin.py``); both are optional.

Position ``i`` of both logprob lists describes the distribution that produced ``output_ids[i]``
(a position whose top-k list came back empty is ``null``). Anything else is a malformed response,
and so is a logprob that is NaN or +inf (a log-probability is at most 0; ``null`` and ``-inf``
mean "probability 0 / unknown" and are judged against the baseline, see ``compare.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class MalformedResponse(ValueError):
    """The target answered 200 with a body that is not a valid SGLang /generate response."""


@dataclass(frozen=True)
class TopLogprob:
    """One of the top-k alternatives at a position."""

    token_id: int
    logprob: float
    text: str | None = None


@dataclass(frozen=True)
class Timing:
    """How fast a target produced one generation, as its ``meta_info`` reports it (seconds,
    tokens/s). ``decode_tps`` is ``decode_throughput`` when sent, otherwise derived from the
    latencies (``decode_source`` says which)."""

    e2e_latency_s: float | None = None
    ttft_s: float | None = None
    decode_tps: float | None = None
    decode_source: str | None = None  # decode_throughput | latencies | e2e_latency

    def to_json(self) -> dict[str, Any]:
        return {
            "e2e_latency_s": self.e2e_latency_s,
            "ttft_s": self.ttft_s,
            "decode_tps": self.decode_tps,
            "decode_source": self.decode_source,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timing:
        return cls(**data)


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def parse_timing(meta: dict[str, Any], completion_tokens: int) -> Timing | None:
    """The timing fields of a finished request's ``meta_info`` (None when it has none)."""
    e2e = _positive(meta.get("e2e_latency"))
    ttft = _positive(meta.get("first_token_latency"))
    decode, source = _positive(meta.get("decode_throughput")), "decode_throughput"
    if decode is None and e2e is not None and ttft is not None and completion_tokens > 1:
        decode_s = e2e - ttft
        decode, source = ((completion_tokens - 1) / decode_s if decode_s > 0 else None), "latencies"
    if decode is None and e2e is not None and completion_tokens > 0:
        decode, source = completion_tokens / e2e, "e2e_latency"
    if e2e is None and ttft is None and decode is None:
        return None
    return Timing(e2e, ttft, decode, source if decode is not None else None)


@dataclass(frozen=True)
class Generation:
    """The greedy output of one target for one prompt, with per-position logprobs."""

    output_ids: tuple[int, ...]
    token_logprobs: tuple[float | None, ...]
    top_logprobs: tuple[tuple[TopLogprob, ...] | None, ...]
    token_texts: tuple[str | None, ...]
    finish_reason: str | None
    text: str = ""
    timing: Timing | None = None
    prompt_tokens: int | None = None  # meta_info.prompt_tokens: the prompt in the target's tokens
    spec_verify_ct: int | None = None  # meta_info.spec_verify_ct: verify forwards (speculative)
    completion_tokens: int | None = None  # meta_info.completion_tokens

    @property
    def accept_length(self) -> float | None:
        """Tokens committed per verify forward (SGLang's accept length); None without both."""
        if self.completion_tokens is None or not self.spec_verify_ct:
            return None
        return self.completion_tokens / self.spec_verify_ct

    def top_map(self, position: int) -> dict[int, float] | None:
        """token id -> logprob of the top-k at ``position`` (None when not reported)."""
        if position >= len(self.top_logprobs) or self.top_logprobs[position] is None:
            return None
        return {t.token_id: t.logprob for t in self.top_logprobs[position]}

    def logprob_problem(self) -> str | None:
        """Why this generation's logprobs cannot be real (NaN or +inf anywhere), or None."""
        for i, lp in enumerate(self.token_logprobs):
            if _impossible(lp):
                return f"output_token_logprobs[{i}] logprob is {lp}"
        for i, top in enumerate(self.top_logprobs):
            for j, t in enumerate(top or ()):
                if _impossible(t.logprob):
                    return f"output_top_logprobs[{i}][{j}] logprob is {t.logprob}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "output_ids": list(self.output_ids),
            "token_logprobs": list(self.token_logprobs),
            "top_logprobs": [
                None if top is None else [[t.logprob, t.token_id, t.text] for t in top]
                for top in self.top_logprobs
            ],
            "token_texts": list(self.token_texts),
            "finish_reason": self.finish_reason,
            "text": self.text,
            "timing": None if self.timing is None else self.timing.to_json(),
            "prompt_tokens": self.prompt_tokens,
            "spec_verify_ct": self.spec_verify_ct,
            "completion_tokens": self.completion_tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Generation:
        return cls(
            output_ids=tuple(data["output_ids"]),
            token_logprobs=tuple(data["token_logprobs"]),
            top_logprobs=tuple(
                None if top is None else tuple(TopLogprob(t[1], t[0], t[2]) for t in top)
                for top in data["top_logprobs"]
            ),
            token_texts=tuple(data["token_texts"]),
            finish_reason=data["finish_reason"],
            text=data.get("text", ""),
            timing=None if data.get("timing") is None else Timing.from_json(data["timing"]),
            prompt_tokens=data.get("prompt_tokens"),
            spec_verify_ct=data.get("spec_verify_ct"),
            completion_tokens=data.get("completion_tokens"),
        )


def _impossible(logprob: float | None) -> bool:
    return logprob is not None and (math.isnan(logprob) or logprob == math.inf)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedResponse(f"{what} is not a number: {value!r}")
    return float(value)


def _triple(item: Any, what: str) -> TopLogprob:
    if not isinstance(item, list | tuple) or len(item) < 2:
        raise MalformedResponse(f"{what} is not [logprob, token_id, text]: {item!r}")
    token = item[1]
    if isinstance(token, bool) or not isinstance(token, int):
        raise MalformedResponse(f"{what} has a non-integer token id: {token!r}")
    text = item[2] if len(item) > 2 and isinstance(item[2], str) else None
    # SGLang sends -inf as a JSON number only through orjson's extensions; None means unknown.
    logprob = float("-inf") if item[0] is None else _number(item[0], f"{what} logprob")
    return TopLogprob(token_id=token, logprob=logprob, text=text)


def _count(value: Any) -> int | None:
    """A non-negative integer count from meta_info, else None (absent or not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def parse_generate_response(body: Any) -> Generation:
    """Turn a /generate JSON body into a Generation; raises MalformedResponse."""
    if not isinstance(body, dict):
        raise MalformedResponse("response is not a JSON object")
    output_ids = body.get("output_ids")
    if not isinstance(output_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in output_ids
    ):
        raise MalformedResponse("'output_ids' missing or not a list of integers")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise MalformedResponse("'meta_info' missing")
    finish = meta.get("finish_reason")
    finish_type = finish.get("type") if isinstance(finish, dict) else finish
    if finish_type is not None and not isinstance(finish_type, str):
        raise MalformedResponse(f"unexpected finish_reason {finish!r}")
    token_lp = meta.get("output_token_logprobs")
    if not isinstance(token_lp, list):
        raise MalformedResponse("'meta_info.output_token_logprobs' missing (return_logprob?)")
    triples = [_triple(item, f"output_token_logprobs[{i}]") for i, item in enumerate(token_lp)]
    if len(triples) != len(output_ids):
        raise MalformedResponse(
            f"{len(triples)} output_token_logprobs for {len(output_ids)} output_ids"
        )
    for i, (triple, token) in enumerate(zip(triples, output_ids, strict=True)):
        if triple.token_id != token:
            raise MalformedResponse(
                f"output_token_logprobs[{i}] is for token {triple.token_id}, output_ids has {token}"
            )
    top_raw = meta.get("output_top_logprobs")
    if not isinstance(top_raw, list) or len(top_raw) != len(output_ids):
        raise MalformedResponse("'meta_info.output_top_logprobs' missing or of the wrong length")
    tops: list[tuple[TopLogprob, ...] | None] = []
    for i, position in enumerate(top_raw):
        if position is None:
            tops.append(None)
            continue
        if not isinstance(position, list):
            raise MalformedResponse(f"output_top_logprobs[{i}] is not a list")
        tops.append(
            tuple(
                _triple(item, f"output_top_logprobs[{i}][{j}]") for j, item in enumerate(position)
            )
        )
    text = body.get("text")
    generation = Generation(
        output_ids=tuple(output_ids),
        token_logprobs=tuple(t.logprob for t in triples),
        top_logprobs=tuple(tops),
        token_texts=tuple(t.text for t in triples),
        finish_reason=finish_type,
        text=text if isinstance(text, str) else "",
        timing=parse_timing(meta, len(output_ids)),
        prompt_tokens=_count(meta.get("prompt_tokens")),
        spec_verify_ct=_count(meta.get("spec_verify_ct")),
        completion_tokens=_count(meta.get("completion_tokens")),
    )
    if problem := generation.logprob_problem():
        raise MalformedResponse(problem)
    return generation
