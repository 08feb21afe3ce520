"""The engine's HTTP API against SGLang 0.5.23's shapes, on one real server process.

Expected shapes come from SGLang's code, imported where it can be (finish reasons from
``schedule_batch.FINISH_*.to_json``, parameter errors from ``SamplingParams.verify``) and otherwise
transcribed from ``TokenizerManager._handle_batch_output`` / ``add_logprob_to_meta_info`` /
``_calculate_spec_decoding_metrics`` (sglang/srt/managers/tokenizer_manager.py):
meta_info = {id, finish_reason, prompt_tokens, weight_version, num_retractions}
            + {reasoning_tokens, completion_tokens, cached_tokens} + e2e_latency when finished
            + first_token_latency, decode_throughput (what SGLang adds with --enable-metrics)
            + spec_{accept_rate, accept_length, num_correct_drafts, num_proposed_drafts, verify_ct}
            + with return_logprob: input_token_logprobs, output_token_logprobs,
              output_token_logprobs_length, and with top_logprobs_num > 0 input_top_logprobs,
              output_top_logprobs; each logprob entry is (logprob, token_id, text-or-None).
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from sglang.srt.managers.schedule_batch import (
    FINISH_LENGTH,
    FINISH_MATCHED_STR,
    FINISH_MATCHED_TOKEN,
)
from sglang.srt.sampling.sampling_params import SamplingParams

from kdtree_inference.engine.tokenizer import EOS_ID, VOCAB_SIZE

BASE_META = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
    "first_token_latency",
    "decode_throughput",
}
SPEC_META = {
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
}
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.fixture(scope="module")
def url(reference_server_module) -> str:
    return reference_server_module(
        attention="op", device="cpu", max_prompt_tokens=256, max_new_tokens_limit=64
    )


@pytest.fixture(scope="module")
def client(url: str):
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def _generate(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/generate", json=body)


def test_generate_single_text(client: httpx.Client) -> None:
    out = _generate(client, text="Hello there", sampling_params=GREEDY).json()
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert set(meta) == BASE_META | SPEC_META
    assert meta["finish_reason"] == FINISH_LENGTH(16).to_json()
    assert meta["prompt_tokens"] == len("Hello there") + 1  # bytes + BOS
    assert meta["completion_tokens"] == len(out["output_ids"]) == 16
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 7  # num_draft_tokens - 1
    assert meta["spec_accept_length"] == pytest.approx(16 / meta["spec_verify_ct"])
    assert out["text"] == bytes(t for t in out["output_ids"] if t < 256).decode(errors="replace")


def test_generate_input_ids_and_batch(client: httpx.Client) -> None:
    single = _generate(client, input_ids=[256, 104, 105], sampling_params=GREEDY).json()
    batch = _generate(
        client, input_ids=[[256, 104, 105], [256, 120]], sampling_params=GREEDY, rid=["a", "b"]
    ).json()
    assert isinstance(batch, list) and len(batch) == 2
    assert [b["meta_info"]["id"] for b in batch] == ["a", "b"]
    assert batch[0]["output_ids"] == single["output_ids"]  # batching changes nothing (greedy)
    texts = _generate(client, text=["ab", "cd", "ef"], sampling_params=GREEDY).json()
    assert len(texts) == 3 and all(len(t["output_ids"]) == 16 for t in texts)


def test_logprobs_shapes(client: httpx.Client) -> None:
    out = _generate(
        client, text="logprobs", sampling_params=GREEDY, return_logprob=True, top_logprobs_num=3
    ).json()
    meta = out["meta_info"]
    logprob_keys = {
        "input_token_logprobs",
        "output_token_logprobs",
        "output_token_logprobs_length",
        "input_top_logprobs",
        "output_top_logprobs",
    }
    assert set(meta) == BASE_META | SPEC_META | logprob_keys
    # Default logprob_start_len=-1 resolves to len(input_ids): no input logprobs.
    assert meta["input_token_logprobs"] == [] and meta["input_top_logprobs"] == []
    assert meta["output_token_logprobs_length"] == 16
    for (lp, token, text), chosen, top in zip(
        meta["output_token_logprobs"], out["output_ids"], meta["output_top_logprobs"], strict=True
    ):
        assert token == chosen and text is None and lp <= 0
        assert len(top) == 3 and all(len(entry) == 3 for entry in top)
        assert top[0][1] == token  # greedy: the chosen token is the top-1
        assert top[0][0] >= top[1][0] >= top[2][0]


def test_logprobs_with_text_and_input_positions(client: httpx.Client) -> None:
    out = _generate(
        client,
        text="abc",
        sampling_params=GREEDY,
        return_logprob=True,
        top_logprobs_num=1,
        logprob_start_len=0,
        return_text_in_logprobs=True,
    ).json()
    meta = out["meta_info"]
    inputs = meta["input_token_logprobs"]
    assert [t for _, t, _ in inputs] == [256, 97, 98, 99]
    assert inputs[0][0] is None and meta["input_top_logprobs"][0] is None  # first token: no context
    assert [text for _, _, text in inputs[1:]] == ["a", "b", "c"]
    assert all(entry[2] is not None for entry in meta["output_token_logprobs"])


def test_stop_string_and_token(client: httpx.Client) -> None:
    free = _generate(client, text="Hello there", sampling_params=GREEDY).json()
    stop = free["text"][5:7]
    out = _generate(client, text="Hello there", sampling_params={**GREEDY, "stop": stop}).json()
    assert out["meta_info"]["finish_reason"] == FINISH_MATCHED_STR(stop).to_json()
    assert out["text"] == free["text"][: free["text"].find(stop)]
    token = free["output_ids"][3]
    out = _generate(
        client, text="Hello there", sampling_params={**GREEDY, "stop_token_ids": [token]}
    ).json()
    assert out["meta_info"]["finish_reason"] == FINISH_MATCHED_TOKEN(token).to_json()
    assert out["output_ids"] == free["output_ids"][: free["output_ids"].index(token) + 1]


def test_eos_stops_unless_ignored(client: httpx.Client) -> None:
    # Prompts until one generates EOS within 64 tokens (the model emits it now and then).
    for i in range(40):
        body = {
            "text": f"prompt {i}: ",
            "sampling_params": {"temperature": 0, "max_new_tokens": 64},
        }
        out = _generate(client, **body).json()
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            assert out["output_ids"][-1] == EOS_ID
            assert out["meta_info"]["finish_reason"] == FINISH_MATCHED_TOKEN(EOS_ID).to_json()
            body["sampling_params"]["ignore_eos"] = True
            longer = _generate(client, **body).json()
            assert len(longer["output_ids"]) == 64
            assert longer["output_ids"][: len(out["output_ids"])] == out["output_ids"]
            return
    pytest.fail("no prompt produced EOS; the EOS path went untested")


def test_sampling_is_seeded(client: httpx.Client) -> None:
    params = {
        "temperature": 0.8,
        "top_p": 0.9,
        "max_new_tokens": 16,
        "sampling_seed": 7,
        "ignore_eos": True,
    }
    a = _generate(client, text="sample", sampling_params=params).json()
    b = _generate(client, text="sample", sampling_params=params).json()
    c = _generate(client, text="sample", sampling_params={**params, "sampling_seed": 8}).json()
    assert a["output_ids"] == b["output_ids"]
    assert a["output_ids"] != c["output_ids"]


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_k": 0},
        {"min_p": 2.0},
        {"max_new_tokens": -1},
    ],
)
def test_out_of_range_is_400_with_sglang_message(client: httpx.Client, bad: dict) -> None:
    with pytest.raises(ValueError) as sglang_error:
        SamplingParams(**bad).verify(VOCAB_SIZE)
    resp = _generate(client, text="x", sampling_params=bad)
    assert resp.status_code == 400
    assert resp.json() == {"error": {"message": str(sglang_error.value)}}


def test_unknown_sampling_key_is_400(client: httpx.Client) -> None:
    with pytest.raises(TypeError):
        SamplingParams(tempurature=0)  # SGLang rejects it too
    resp = _generate(client, text="x", sampling_params={"tempurature": 0})
    assert resp.status_code == 400
    assert "tempurature" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"text": "x" * 300}, "limit is 256"),
        ({"text": "x", "sampling_params": {"max_new_tokens": 65}}, "exceeds the limit of 64"),
        ({"text": "x", "input_ids": [1]}, "exactly one"),
        ({}, "exactly one"),
        ({"input_ids": [999]}, "input_ids must be in"),
        ({"text": "x", "sampling_params": {"regex": "a+"}}, "not supported"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "1 entries for a batch of 2"),
        ({"text": 5}, "text"),
    ],
)
def test_bad_requests_are_400(client: httpx.Client, body: dict, fragment: str) -> None:
    resp = client.post("/generate", json=body)
    assert resp.status_code == 400
    assert fragment in resp.json()["error"]["message"]


def test_invalid_json_is_400(client: httpx.Client) -> None:
    resp = client.post(
        "/generate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert "not valid JSON" in resp.json()["error"]["message"]


DEEP = 100_000


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        pytest.param(b"[" * DEEP + b"]" * DEEP, "nested too deeply", id="deep-list"),
        pytest.param(b'{"a":' * DEEP + b"1" + b"}" * DEEP, "nested too deeply", id="deep-object"),
        pytest.param(
            b'{"text": "x", "sampling_params": {"custom_params": '
            + b"[" * DEEP
            + b"]" * DEEP
            + b"}}",
            "nested too deeply",
            id="deep-inside-a-field",
        ),
        pytest.param(b'{"text": "\xff"}', "not valid JSON", id="not-utf8"),
        pytest.param(b"null", "must be a JSON object", id="null"),
        pytest.param(b"[1, 2]", "must be a JSON object", id="a-list"),
    ],
)
@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
def test_malformed_bodies_are_4xx_json(
    client: httpx.Client, path: str, raw: bytes, says: str
) -> None:
    resp = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text[:300]
    assert says in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/generate",
            {
                "text": "x",
                "sampling_params": {"temperature": 1, "max_new_tokens": 2, "sampling_seed": 10**30},
            },
        ),
        ("/v1/completions", {"prompt": "x", "temperature": 1, "max_tokens": 2, "seed": 10**30}),
    ],
)
def test_a_seed_out_of_torch_range_is_400(client: httpx.Client, path: str, body: dict) -> None:
    resp = client.post(path, json=body)
    assert resp.status_code == 400 and "sampling_seed" in resp.json()["error"]["message"]


def test_requests_total_counts_every_answer_by_status(client: httpx.Client) -> None:
    def count(status: int) -> float:
        key = f'kdtree_engine_requests_total{{attention="op",status="{status}"}}'
        for line in client.get("/metrics").text.splitlines():
            if line.startswith(key + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    ok_before, bad_before = count(200), count(400)
    _generate(client, text="counted", sampling_params={**GREEDY, "max_new_tokens": 2})
    client.post("/generate", json={"text": 5})
    client.post("/v1/completions", content=b"[" * DEEP + b"]" * DEEP)
    assert (count(200) - ok_before, count(400) - bad_before) == (1.0, 2.0)


def stream_events(client: httpx.Client, body: dict) -> tuple[list[dict], int]:
    """The JSON events of one SSE /generate (after checking it ends with [DONE]) and its size."""
    chunks, size = [], 0
    with client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            size += len(line) + 1
            if line.startswith("data: "):
                chunks.append(line[len("data: ") :])
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]], size


def test_stream_sends_increments_like_sglangs_incremental_streaming_output(
    client: httpx.Client,
) -> None:
    body = {
        "text": "stream me",
        "sampling_params": {**GREEDY, "max_new_tokens": 64},
        "return_logprob": True,
        "top_logprobs_num": 50,
        "return_text_in_logprobs": True,
    }
    events, size = stream_events(client, body)
    plain = _generate(client, **body)
    whole = plain.json()
    assert len(events) >= 2
    final = events[-1]["meta_info"]
    assert final["finish_reason"] == FINISH_LENGTH(64).to_json()
    assert final["completion_tokens"] == final["output_token_logprobs_length"] == 64
    # Each event carries only its own tokens, text and output logprobs (SGLang slices the same
    # keys, tokenizer_manager._slice_streaming_output_meta_info); together they are the output.
    assert [t for e in events for t in e["output_ids"]] == whole["output_ids"]
    assert "".join(e["text"] for e in events) == whole["text"]
    for key in ("output_token_logprobs", "output_top_logprobs"):
        assert [x for e in events for x in e["meta_info"][key]] == whole["meta_info"][key]
    for e in events:
        assert len(e["meta_info"]["output_token_logprobs"]) == len(e["output_ids"])
    # So the stream costs about what the answer costs, not that times the number of events.
    assert size < 1.5 * len(plain.content), (size, len(plain.content), len(events))


def test_model_info_fields(client: httpx.Client) -> None:
    info = client.get("/model_info").json()
    # The keys SGLang's /model_info returns (http_server.model_info).
    for key in (
        "model_path",
        "served_model_name",
        "tokenizer_path",
        "is_generation",
        "preferred_sampling_params",
        "weight_version",
        "has_image_understanding",
        "model_type",
        "architectures",
    ):
        assert key in info
    assert info["is_generation"] is True
    assert info["kdtree_engine"]["attention_backend"] == "op"


def test_openai_completions(client: httpx.Client) -> None:
    resp = client.post(
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": "Hello there",
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 2,
        },
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    choice = body["choices"][0]
    plain = _generate(client, text="Hello there", sampling_params=GREEDY).json()
    assert choice["text"] == plain["text"] and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["token_logprobs"]) == 16
    assert all(len(top) == 2 for top in choice["logprobs"]["top_logprobs"])
    usage = {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert usage == {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28}
    bad = client.post("/v1/completions", json={"prompt": "x", "temperature": -2})
    assert bad.status_code == 400


def test_metrics_count_requests_and_drafts(client: httpx.Client) -> None:
    def scrape() -> dict[str, float]:
        values = {}
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("kdtree_engine_") and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    before = scrape()
    out = _generate(client, text="metrics", sampling_params=GREEDY).json()
    after = scrape()
    key = 'kdtree_engine_generation_tokens_total{attention="op"}'
    assert after[key] - before.get(key, 0.0) == 16
    steps = 'kdtree_engine_spec_verify_steps_total{attention="op"}'
    assert after[steps] - before.get(steps, 0.0) == out["meta_info"]["spec_verify_ct"]
    assert after['kdtree_engine_ready{attention="op"}'] == 1.0


def test_concurrent_requests_match_sequential_ones(client: httpx.Client, url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"concurrent {i} " * (i + 1) for i in range(6)]
    sequential = [
        _generate(client, text=t, sampling_params=GREEDY).json()["output_ids"] for t in texts
    ]

    def one(text: str) -> list[int]:
        with httpx.Client(base_url=url, timeout=120) as own:
            return _generate(own, text=text, sampling_params=GREEDY).json()["output_ids"]

    with ThreadPoolExecutor(max_workers=6) as pool:
        concurrent = list(pool.map(one, texts))
    assert concurrent == sequential


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_requests_whose_client_went_away_are_aborted(reference_server) -> None:
    """SGLang aborts a request on disconnect; so does the engine, streaming or not: abandoned
    1024-token generations stop at once instead of keeping the engine busy."""
    url = reference_server(attention="reference", device="cpu")
    long = {"temperature": 0, "max_new_tokens": 1024, "ignore_eos": True}
    for i in range(3):  # streams: read the first event, then hang up
        with (
            httpx.Client(base_url=url, timeout=60) as c,
            c.stream(
                "POST",
                "/generate",
                json={"text": f"abandon {i}", "stream": True, "sampling_params": long},
            ) as resp,
        ):
            next(line for line in resp.iter_lines() if line.startswith("data: "))
    for i in range(3):  # plain requests: the client gives up after half a second
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                url + "/generate",
                json={"text": f"give up {i}", "sampling_params": long},
                timeout=httpx.Timeout(60, read=0.5),
            )
    deadline = time.monotonic() + 10
    while metric(url, "kdtree_engine_aborted_requests_total") < 6:
        assert time.monotonic() < deadline, httpx.get(url + "/metrics").text
        time.sleep(0.2)
    while metric(url, "kdtree_engine_running_requests") > 0:
        assert time.monotonic() < deadline, "aborted requests are still being decoded"
        time.sleep(0.2)
    assert metric(url, "kdtree_engine_generation_tokens_total") == 0  # none ran to the end
    started = time.monotonic()
    normal = httpx.post(
        url + "/generate",
        timeout=60,
        json={"text": "next", "sampling_params": {**long, "max_new_tokens": 8}},
    )
    assert normal.status_code == 200 and len(normal.json()["output_ids"]) == 8
    assert time.monotonic() - started < 10
