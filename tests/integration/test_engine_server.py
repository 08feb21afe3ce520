"""The engine as a real server process: startup, readiness, CLI contract, shutdown."""

from __future__ import annotations

import time

import httpx
import pytest


def test_health_is_503_until_warm_then_200(reference_server) -> None:
    url = reference_server(device="cpu", warmup_delay=3, wait_ready=False)
    not_ready = httpx.get(url + "/health", timeout=5)
    assert not_ready.status_code == 503
    assert "starting" in not_ready.json()["error"]["message"]
    early = httpx.post(url + "/generate", json={"text": "hi"}, timeout=5)
    assert early.status_code == 503
    # What sglang.bench_serving polls before it starts (its readiness check).
    assert httpx.get(url + "/v1/models", timeout=5).status_code == 503
    for _ in range(200):
        if httpx.get(url + "/health", timeout=5).status_code == 200:
            break
        time.sleep(0.1)
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    assert httpx.get(url + "/v1/models", timeout=5).status_code == 200


def test_fault_layer_makes_a_different_model(reference_server) -> None:
    good = reference_server(attention="op", device="cpu")
    bad = reference_server(attention="op", device="cpu", fault_layer=1, fault_scale=3.0)
    body = {
        "text": "Once upon a time",
        "sampling_params": {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True},
    }
    a = httpx.post(good + "/generate", json=body, timeout=60).json()["output_ids"]
    b = httpx.post(bad + "/generate", json=body, timeout=60).json()["output_ids"]
    assert a != b


def test_kdtree_verify_validate_reports_the_difference_in_metrics(reference_server) -> None:
    url = reference_server(device="cpu", env={"KDTREE_VERIFY": "validate"})
    assert (
        httpx.get(url + "/model_info", timeout=5).json()["kdtree_engine"]["attention_backend"]
        == "validate"
    )
    body = {"text": "validate me", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    assert httpx.post(url + "/generate", json=body, timeout=60).status_code == 200
    metrics = {}
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("kdtree_engine_validate"):
            name, value = line.rsplit(" ", 1)
            metrics[name.split("{")[0]] = float(value)
    assert metrics["kdtree_engine_validate_calls"] > 0
    assert 0.0 <= metrics["kdtree_engine_validate_max_abs_diff"] < 1e-4


def test_a_server_that_cannot_start_exits_with_the_reason(reference_server) -> None:
    # SGLang's Triton kernel on a CPU machine needs the interpreter; without it the engine must
    # say so and exit, not sit there answering 503 forever.
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1") as failure:
        reference_server(
            attention="triton", device="cpu", env={"TRITON_INTERPRET": "0"}, timeout=60
        )
    assert "engine exited with 1" in str(failure.value)
