"""The engine's OpenAI routes driven by the clients SGLang users have, on one real server.

Shapes are checked with SGLang 0.5.23's own response models: an answer that SGLang's
``ChatCompletionResponse`` (etc.) parses and serialises back to exactly the same JSON has
SGLang's field names, types and optional-field conventions. The ``openai`` package and
``python -m sglang.bench_serving`` run against the server unchanged; the benchmark runs offline
(its ``random-ids`` dataset, the tokenizer from ``/model_info``'s ``tokenizer_path``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    CompletionResponse,
    CompletionStreamResponse,
    ModelList,
)
from transformers import AutoTokenizer

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Where is the key? Look under the mat."},
]
GREEDY_CHAT = {"messages": MESSAGES, "temperature": 0, "max_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module")
def url(reference_server_module) -> str:
    return reference_server_module(
        attention="op", device="cpu", max_prompt_tokens=512, max_new_tokens_limit=64
    )


@pytest.fixture(scope="module")
def client(url: str):
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def _same_as_sglang_serialises(model_cls, payload: dict) -> None:
    assert model_cls.model_validate(payload).model_dump(mode="json") == payload


def _sse(client: httpx.Client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_models_lists_the_served_model(client: httpx.Client) -> None:
    body = client.get("/v1/models").json()
    _same_as_sglang_serialises(ModelList, body)
    (card,) = body["data"]
    assert card["id"] == client.get("/model_info").json()["served_model_name"]
    assert card["max_model_len"] == 4096


def test_greedy_chat_is_greedy_generate_on_the_shipped_chat_template(
    client: httpx.Client,
) -> None:
    body = {
        **GREEDY_CHAT,
        "logprobs": True,
        "top_logprobs": 3,
        "return_token_ids": True,
        "return_meta_info": True,
        "return_output_ids_in_sglext": True,
        "return_spec_tokens_details": True,
    }
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    _same_as_sglang_serialises(ChatCompletionResponse, answer)
    (choice,) = answer["choices"]
    # The prompt is what a Hugging Face client builds from the tokenizer the engine points
    # SGLang's tools to (the chat template included), <bos> first.
    hf = AutoTokenizer.from_pretrained(client.get("/model_info").json()["tokenizer_path"])
    prompt = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert choice["prompt_token_ids"] == hf.encode(prompt)
    plain = client.post(
        "/generate",
        json={
            "text": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
            "return_logprob": True,
            "top_logprobs_num": 3,
            "return_text_in_logprobs": True,
        },
    ).json()
    assert choice["response_token_ids"] == plain["output_ids"]
    assert answer["sglext"]["output_ids"] == [plain["output_ids"]]
    assert choice["message"] == {
        "role": "assistant",
        "content": plain["text"],
        "reasoning_content": None,
    }
    assert choice["finish_reason"] == "length" and choice["matched_stop"] is None
    # Per-token logprobs as OpenAI returns them, the native triples under meta_info.
    native = plain["meta_info"]
    content = choice["logprobs"]["content"]
    assert [(c["logprob"], c["token"]) for c in content] == [
        (lp, text) for lp, _, text in native["output_token_logprobs"]
    ]
    assert [c["bytes"] for c in content] == [[t] for t in plain["output_ids"]]
    assert [[(t["logprob"], t["token"]) for t in c["top_logprobs"]] for c in content] == [
        [(lp, text) for lp, _, text in row] for row in native["output_top_logprobs"]
    ]
    assert choice["meta_info"]["output_token_logprobs"] == native["output_token_logprobs"]
    spec = answer["sglext"]["spec_tokens_details"]
    assert spec["spec_verify_ct"] == choice["meta_info"]["spec_verify_ct"] > 0
    assert answer["usage"]["completion_tokens"] == 24
    assert answer["usage"]["prompt_tokens"] == len(choice["prompt_token_ids"])


def test_chat_stream_adds_up_to_the_answer(client: httpx.Client) -> None:
    body = {**GREEDY_CHAT, "logprobs": True, "top_logprobs": 2}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    chunks = _sse(
        client,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    for chunk in chunks:
        _same_as_sglang_serialises(ChatCompletionStreamResponse, chunk)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(d["delta"]["content"] or "" for d in deltas) == whole["message"]["content"]
    streamed = [x for d in deltas if d["logprobs"] for x in d["logprobs"]["content"]]
    assert streamed == whole["logprobs"]["content"]
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24


def test_completions_stream_adds_up_to_the_answer(client: httpx.Client) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "logprobs": 2}
    whole = client.post("/v1/completions", json=body).json()
    _same_as_sglang_serialises(CompletionResponse, whole)
    chunks = _sse(client, "/v1/completions", {**body, "stream": True})
    for chunk in chunks:
        _same_as_sglang_serialises(CompletionStreamResponse, chunk)
    choices = [c["choices"][0] for c in chunks]
    (answer,) = whole["choices"]
    assert "".join(c["text"] for c in choices) == answer["text"]
    assert [t for c in choices for t in c["logprobs"]["tokens"]] == answer["logprobs"]["tokens"]
    assert [o for c in choices for o in c["logprobs"]["text_offset"]] == answer["logprobs"][
        "text_offset"
    ]
    assert choices[-1]["finish_reason"] == answer["finish_reason"]


def test_the_openai_client_runs_unchanged(url: str) -> None:
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    (model,) = oa.models.list().data
    chat = oa.chat.completions.create(
        model=model.id,
        messages=MESSAGES,
        temperature=0,
        max_tokens=12,
        logprobs=True,
        top_logprobs=2,
    )
    text = chat.choices[0].message.content
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens
    stream = oa.chat.completions.create(
        model=model.id, messages=MESSAGES, temperature=0, max_tokens=12, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    whole = oa.completions.create(model=model.id, prompt="abc", max_tokens=5, temperature=0)
    assert whole.usage.completion_tokens == 5 and whole.choices[0].finish_reason == "length"
    stream = oa.completions.create(
        model=model.id, prompt="abc", max_tokens=5, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"messages": []}, "messages must not be empty"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role must be one of"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "'image_url' is not supported",
        ),
        ({"messages": MESSAGES, "top_logprobs": 2}, "requires logprobs"),
        ({"messages": MESSAGES, "tools": [{"type": "function"}]}, "['tools'] not supported"),
        ({"messages": MESSAGES, "n": 2}, "not supported"),
        ({"messages": MESSAGES, "stream": True, "return_token_ids": True}, "with streaming"),
        ({"messages": MESSAGES, "temperature": -1}, "temperature must be"),
    ],
)
def test_chat_refusals_are_400_with_a_reason(
    client: httpx.Client, body: dict, fragment: str
) -> None:
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    assert fragment in resp.json()["error"]["message"]


@pytest.mark.parametrize("backend", ["sglang-oai", "sglang-oai-chat"])
def test_sglang_bench_serving_completes(url: str, backend: str, tmp_path: Path) -> None:
    prompts = 6
    result = tmp_path / "bench.jsonl"
    # Offline: random-ids needs no dataset file, and the tokenizer comes from the server.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "sglang.bench_serving",
            "--backend", backend, "--base-url", url,
            "--dataset-name", "random-ids", "--num-prompts", str(prompts),
            "--random-input-len", "48", "--random-output-len", "16", "--random-range-ratio", "1",
            "--request-rate", "inf", "--max-concurrency", "3", "--disable-tqdm",
            "--output-file", str(result),
        ],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(result.read_text().splitlines()[-1])
    assert summary["completed"] == prompts, proc.stdout[-3000:]
    assert summary["total_output_tokens"] == prompts * 16
