"""The engine's parts on their own: tokenizer, KV pool, drafter, request validation, weights,
sampling, configuration, and the engine's bookkeeping (no leaked KV slots, limits)."""

from __future__ import annotations

import hashlib
import time

import pytest
import torch

from kdtree_inference.engine.config import (
    EngineConfig,
    ModelConfig,
    SpecConfig,
    default_attention_backend,
)
from kdtree_inference.engine.corpus import prompts
from kdtree_inference.engine.drafter import NgramIndex, NgramTreeDrafter
from kdtree_inference.engine.kv_pool import MLAKVPool, PoolExhaustedError
from kdtree_inference.engine.margins import greedy_margins, summarize
from kdtree_inference.engine.model import (
    load_weights,
    load_weights_with_digest,
    save_weights,
    seeded_digest,
    seeded_weights,
)
from kdtree_inference.engine.protocol import GenerateRequestModel, RequestError, build_requests
from kdtree_inference.engine.sampling import sample_token
from kdtree_inference.engine.scheduler import (
    Engine,
    EngineStepError,
    GenerationRequest,
    RequestAborted,
)
from kdtree_inference.engine.server import build_parser, config_from_args
from kdtree_inference.engine.tokenizer import BOS_ID, EOS_ID, ByteTokenizer


@pytest.fixture(scope="module")
def engine():
    eng = Engine(EngineConfig(kv_pool_size=4096))
    eng.start()
    eng.wait_ready()
    yield eng
    eng.stop()


def test_tokenizer_round_trip_and_specials() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓")
    assert ids[0] == BOS_ID and all(0 <= t < 256 for t in ids[1:])
    assert tok.decode(ids) == "héllo ✓"
    assert tok.decode([104, EOS_ID], skip_special_tokens=False) == "h<eos>"
    assert tok.decode([0xE2, 0x9C]) == "\ufffd"  # a cut multi-byte character is replaced


def test_pool_hands_out_scattered_unique_slots_and_takes_them_back() -> None:
    pool = MLAKVPool(size=1024, num_layers=2)
    a, b = pool.alloc(100), pool.alloc(100)
    slots = torch.cat([a, b]).tolist()
    assert len(set(slots)) == 200 and 0 not in slots
    assert (torch.diff(a) == 1).float().mean() < 0.1  # fragmented, not a contiguous run
    assert pool.num_free == 1023 - 200
    pool.free(a)
    assert pool.num_free == 1023 - 100
    with pytest.raises(PoolExhaustedError):
        pool.alloc(2000)
    v = pool.get_value_buffer(1)
    assert v.shape == (1024, 1, 512) and v.data_ptr() == pool.get_key_buffer(1).data_ptr()


def test_drafter_builds_exact_size_trees_from_ngrams() -> None:
    spec = SpecConfig(num_draft_tokens=8, topk=2, max_depth=3)
    drafter = NgramTreeDrafter(spec, vocab_size=259)
    index = NgramIndex(spec.ngram_min, spec.ngram_max)
    index.extend(list(b"abcabxabcab"))
    tree = drafter.propose(index, root_token=ord("c"))
    assert tree.size == 8 and tree.tokens[0] == ord("c") and tree.parents[0] == -1
    assert all(0 <= tree.parents[i] < i for i in range(1, tree.size))
    assert max(tree.depths) <= spec.max_depth
    kids = tree.children()
    # "abc" was always followed by "a": the first child of the root continues the n-gram.
    assert tree.tokens[kids[0][0]] == ord("a")
    assert all(len(kids[i]) <= spec.topk for i in range(1, tree.size))
    visible = tree.visibility()
    for i in range(tree.size):
        ancestors, j = set(), i
        while j >= 0:
            ancestors.add(j)
            j = tree.parents[j]
        assert set(torch.nonzero(visible[i]).flatten().tolist()) == ancestors


def test_drafter_tops_up_an_empty_context() -> None:
    drafter = NgramTreeDrafter(SpecConfig(num_draft_tokens=6, topk=2), vocab_size=259)
    tree = drafter.propose(NgramIndex(1, 3), root_token=65)
    assert tree.size == 6 and set(tree.parents[1:]) == {0}
    assert len(set(tree.tokens[1:])) == 5  # distinct guesses


def test_engine_returns_every_kv_slot(engine: Engine) -> None:
    free_before = engine.pool.num_free
    futures = [
        engine.submit(
            GenerationRequest(
                rid=str(i), input_ids=engine.tokenizer.encode(t), max_new_tokens=20, temperature=0.0
            )
        )
        for i, t in enumerate(prompts(5))
    ]
    for f in futures:
        f.result(timeout=120)
    assert engine.pool.num_free == free_before == engine.config.kv_pool_size - 1


def test_engine_refuses_a_request_larger_than_the_pool(engine: Engine) -> None:
    future = engine.submit(GenerationRequest(rid="big", input_ids=[65] * 3000, max_new_tokens=2000))
    with pytest.raises(ValueError, match="KV slots"):
        future.result(timeout=60)


def test_zero_new_tokens(engine: Engine) -> None:
    res = engine.generate(GenerationRequest(rid="z", input_ids=[BOS_ID, 65], max_new_tokens=0))
    assert res.output_ids == [] and res.finish_reason == {"type": "length", "length": 0}


def test_seeded_weights_are_reproducible_and_round_trip_safetensors(tmp_path) -> None:
    cfg = ModelConfig(num_layers=1)
    a, b = seeded_weights(cfg), seeded_weights(cfg)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["lm_head.weight"], seeded_weights(ModelConfig(num_layers=1, seed=1))["lm_head.weight"]
    )
    save_weights(a, tmp_path)
    loaded = load_weights(cfg, tmp_path)
    assert all(torch.equal(a[k], loaded[k]) for k in a)
    with pytest.raises(ValueError, match="shape"):
        load_weights(ModelConfig(num_layers=1, hidden_size=128), tmp_path)
    with pytest.raises(ValueError, match="missing"):
        load_weights(ModelConfig(num_layers=2), tmp_path)
    with pytest.raises(FileNotFoundError):
        load_weights(cfg, tmp_path / "nowhere")


def test_engine_serves_weights_from_a_directory(tmp_path) -> None:
    cfg = ModelConfig(num_layers=1, seed=3)
    save_weights(seeded_weights(cfg), tmp_path)
    outs = []
    for weights_dir in (None, str(tmp_path)):
        # The directory's weights (seed 3) replace the seeded ones (seed 0 here).
        model = ModelConfig(num_layers=1, seed=0 if weights_dir else 3)
        eng = Engine(EngineConfig(model=model, weights_dir=weights_dir, kv_pool_size=1024))
        eng.start()
        eng.wait_ready()
        req = GenerationRequest(
            rid="w", input_ids=[BOS_ID, 72, 105], max_new_tokens=12, ignore_eos=True
        )
        outs.append(eng.generate(req, timeout=60).output_ids)
        eng.stop()
    assert outs[0] == outs[1]


def test_greedy_margins_are_rarely_near_ties(engine: Engine) -> None:
    stats = summarize(greedy_margins(engine, prompts(8), 24))
    assert stats["positions"] == 8 * 24
    assert stats["median"] > 0.5
    assert stats["fraction_below_0.01"] < 0.02


def test_sampling_rules() -> None:
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert sample_token(logits, 0.0, -1, 1.0, 0.0, None) == 1
    gen = torch.Generator().manual_seed(0)
    assert {sample_token(logits, 1.0, 1, 1.0, 0.0, gen) for _ in range(20)} == {1}  # top_k=1
    gen = torch.Generator().manual_seed(0)
    picks = {sample_token(logits, 1.0, -1, 0.6, 0.0, gen) for _ in range(50)}
    assert picks <= {1, 2} and len(picks) == 2  # top_p keeps the two near-equal tokens only


def test_kdtree_verify_selects_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_attention_backend("cpu", "off") == "reference"
    assert default_attention_backend("cuda", "off") == "triton"
    assert default_attention_backend("cpu", "on") == "op"
    assert default_attention_backend("cuda", "validate") == "validate"
    monkeypatch.setenv("KDTREE_VERIFY", "on")
    assert default_attention_backend("cpu") == "op"
    with pytest.raises(ValueError, match="KDTREE_VERIFY"):
        default_attention_backend("cpu", "sometimes")


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="attention"):
        EngineConfig(attention="flash")
    with pytest.raises(ValueError, match="fault layer"):
        EngineConfig(fault_layer=5)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        SpecConfig(num_draft_tokens=0)


def test_request_building() -> None:
    cfg, tok = EngineConfig(max_prompt_tokens=32, max_new_tokens_limit=16), ByteTokenizer()

    def build(body: dict) -> tuple:
        return build_requests(GenerateRequestModel.model_validate(body), cfg, tok)

    sampling = {"temperature": None, "max_new_tokens": 4, "stop": "x"}
    reqs, is_batch = build({"text": ["a", "b"], "sampling_params": sampling, "rid": "r"})
    assert is_batch and [r.rid for r in reqs] == ["r_0", "r_1"]
    assert reqs[0].temperature == 1.0  # null means SGLang's default, 1.0
    assert reqs[0].stop_strs == ["x"] and reqs[0].max_new_tokens == 4
    with pytest.raises(RequestError, match="limit of 16"):
        build({"text": "a", "sampling_params": {"max_new_tokens": 17}})
    with pytest.raises(RequestError, match="unknown sampling parameter"):
        build({"text": "a", "sampling_params": {"max_tokens": 1}})
    with pytest.raises(RequestError, match="not supported"):
        build({"text": "a", "sampling_params": {"n": 2}})


def test_a_failing_forward_fails_its_requests_and_the_engine_recovers() -> None:
    eng = Engine(EngineConfig(kv_pool_size=2048))
    eng.start()
    eng.wait_ready()
    try:
        calls = {"n": 0}

        def fail_third_call(args: dict) -> None:
            calls["n"] += 1
            if calls["n"] == 3:  # prefill (2 layers) succeeds, the first verify step fails
                raise RuntimeError("injected kernel failure")

        eng.model.attention.observers.append(fail_third_call)
        future = eng.submit(
            GenerationRequest(rid="f", input_ids=[BOS_ID, 65, 66], max_new_tokens=8)
        )
        with pytest.raises(EngineStepError, match="injected kernel failure"):
            future.result(timeout=60)
        eng.model.attention.observers.clear()
        assert eng.pool.num_free == 2047  # nothing leaked
        ok = eng.generate(GenerationRequest(rid="g", input_ids=[BOS_ID, 65], max_new_tokens=4), 60)
        assert len(ok.output_ids) == 4
    finally:
        eng.stop()


def test_weights_identity_names_the_file_and_its_digest(tmp_path) -> None:
    cfg = ModelConfig(num_layers=1)
    a, b = tmp_path / "a", tmp_path / "b"
    save_weights(seeded_weights(ModelConfig(num_layers=1, seed=1)), a)
    save_weights(seeded_weights(ModelConfig(num_layers=1, seed=2)), b)
    _, ident_a = load_weights_with_digest(cfg, a)
    _, ident_b = load_weights_with_digest(cfg, b)
    assert ident_a["path"] == str((a / "model.safetensors").resolve())
    assert ident_a["sha256"] == hashlib.sha256((a / "model.safetensors").read_bytes()).hexdigest()
    assert ident_a["sha256"] != ident_b["sha256"]
    assert seeded_digest(cfg) == seeded_digest(ModelConfig(num_layers=1))
    assert seeded_digest(cfg) != seeded_digest(ModelConfig(num_layers=1, seed=1))


def test_fault_layer_and_fault_scale_go_together() -> None:
    parser = build_parser()
    for argv in (["--fault-layer", "1"], ["--fault-scale", "1.5"]):
        with pytest.raises(ValueError, match="go together"):
            config_from_args(parser.parse_args(argv))
    config = config_from_args(parser.parse_args(["--fault-layer", "1", "--fault-scale", "1.5"]))
    assert (config.fault_layer, config.fault_scale) == (1, 1.5)


def test_an_aborted_request_stops_and_gives_its_slots_back(engine: Engine) -> None:
    free_before = engine.pool.num_free
    steps: list[int] = []
    req = GenerationRequest(
        rid="gone",
        input_ids=[BOS_ID, 72],
        max_new_tokens=1000,
        ignore_eos=True,
        on_progress=lambda res: steps.append(len(res.output_ids)),
    )
    future = engine.submit(req)
    deadline = time.monotonic() + 60
    while not steps:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    aborted_before = engine.num_aborted
    engine.abort(req)
    with pytest.raises(RequestAborted, match="aborted after"):
        future.result(timeout=30)
    assert max(steps) < 1000 and engine.num_aborted == aborted_before + 1
    waiting = GenerationRequest(rid="never", input_ids=[BOS_ID, 65], max_new_tokens=5)
    waiting.aborted = True  # aborted before the worker admitted it
    with pytest.raises(RequestAborted):
        engine.submit(waiting).result(timeout=30)
    assert engine.pool.num_free == free_before
