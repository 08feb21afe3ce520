"""Chat traffic: a corpus entry with ``messages`` replayed through ``/v1/chat/completions``.

The server applies its own chat template, so the gate compares what chat clients get. The
request is greedy (``temperature: 0``) with ``logprobs``/``top_logprobs`` and SGLang 0.5.23's
extensions ``return_token_ids`` (the choice's ``response_token_ids``) and ``return_meta_info``
(the choice's ``meta_info``: the same dict ``/generate`` answers with, logprob triples with
token ids, ``prompt_tokens``, ``spec_verify_ct`` and the timings;
``srt/entrypoints/openai/serving_chat.py``). A choice with ``meta_info`` is parsed exactly as a
``/generate`` answer. Without it (an OpenAI-compatible server that ignores the extensions) the
token ids come from ``response_token_ids`` and the chosen tokens' logprobs from
``logprobs.content[i].logprob``; the alternatives then carry no token ids, so they are not
reported (a divergence there cannot be called a near-tie). An answer with no token ids at all
cannot be compared token by token and is malformed.
"""

from __future__ import annotations

from typing import Any

from kdtree_parity.corpus import CorpusEntry
from kdtree_parity.generation import Generation, MalformedResponse, parse_generate_response
from kdtree_parity.policy import ReplaySettings

CHAT_PATH = "/v1/chat/completions"


def build_chat_request(entry: CorpusEntry, replay: ReplaySettings) -> dict[str, Any]:
    """The exact /v1/chat/completions body sent to every target for a ``messages`` entry."""
    return {
        "messages": [dict(m) for m in entry.messages or ()],
        "temperature": 0,
        "max_completion_tokens": entry.max_new_tokens or replay.max_new_tokens,
        "logprobs": True,
        "top_logprobs": replay.top_logprobs_num,
        "return_token_ids": True,
        "return_meta_info": True,
        "stream": False,
    }


def parse_chat_response(body: Any) -> Generation:
    """A /v1/chat/completions body as a Generation; raises MalformedResponse."""
    if not isinstance(body, dict):
        raise MalformedResponse("response is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse("'choices' missing or empty")
    choice = choices[0]
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    text = content if isinstance(content, str) else ""
    ids = choice.get("response_token_ids")
    meta = choice.get("meta_info")
    if isinstance(meta, dict):
        if ids is None:
            ids = [t[1] for t in meta.get("output_token_logprobs") or () if isinstance(t, list)]
        return parse_generate_response({"text": text, "output_ids": ids, "meta_info": meta})
    if not isinstance(ids, list):
        raise MalformedResponse(
            "the chat answer has neither 'meta_info' nor 'response_token_ids' "
            "(SGLang's return_meta_info / return_token_ids): no token ids to compare"
        )
    logprobs = choice.get("logprobs")
    positions = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(positions, list) or len(positions) != len(ids):
        raise MalformedResponse("'logprobs.content' missing or not one entry per output token")
    triples = []
    for i, (token, position) in enumerate(zip(ids, positions, strict=True)):
        if not isinstance(position, dict):
            raise MalformedResponse(f"logprobs.content[{i}] is not an object")
        triples.append([position.get("logprob"), token, position.get("token")])
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    finish = choice.get("finish_reason")
    return parse_generate_response(
        {
            "text": text,
            "output_ids": ids,
            "meta_info": {
                "finish_reason": {"type": finish} if isinstance(finish, str) else None,
                "output_token_logprobs": triples,
                "output_top_logprobs": [None] * len(ids),
                "prompt_tokens": usage.get("prompt_tokens"),
                "completion_tokens": usage.get("completion_tokens"),
            },
        }
    )
