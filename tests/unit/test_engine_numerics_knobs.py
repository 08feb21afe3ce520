"""The reference engine's parity-gate knobs: split-KV attention (equivalent numerics, the A/A'
floor), the per-decode-step delay (a slow candidate on purpose) and SGLang's timing fields."""

from __future__ import annotations

import time

import pytest
import torch

from kdtree_inference.engine.attention import AttentionBackend, ExtendMetadata
from kdtree_inference.engine.config import EngineConfig
from kdtree_inference.engine.corpus import prompts
from kdtree_inference.engine.scheduler import Engine, GenerationRequest
from kdtree_verify import VerifyMetadata, verify_attention_reference


def _verify_inputs(prefix_lens: list[int], n: int = 4, heads: int = 8):
    """A random batch in the engine's verify layout, tree masks included."""
    gen = torch.Generator().manual_seed(0)
    slots = sum(prefix_lens) + 8
    k_buffer = torch.randn(slots, 1, 576, generator=gen)
    v_buffer = k_buffer[..., :512].clone()
    q = torch.randn(len(prefix_lens) * n, heads, 576, generator=gen)
    k_extend = torch.randn(len(prefix_lens) * n, 1, 576, generator=gen)
    v_extend = k_extend[..., :512].clone()
    perm = torch.randperm(sum(prefix_lens), generator=gen)
    kv_indptr = torch.tensor([0, *torch.cumsum(torch.tensor(prefix_lens), 0).tolist()])
    masks = []
    for p in prefix_lens:
        block = torch.ones(n, p + n, dtype=torch.bool)
        block[:, p:] = torch.ones(n, n, dtype=torch.bool).tril()
        block[n - 1, p + 1] = False  # a branch: the last node does not see node 1
        masks.append(block.flatten())
    mask_indptr = torch.tensor(
        [0, *torch.cumsum(torch.tensor([n * (p + n) for p in prefix_lens]), 0).tolist()]
    )
    meta = ExtendMetadata(
        qo_indptr=torch.arange(len(prefix_lens) + 1, dtype=torch.int32) * n,
        kv_indptr=kv_indptr.to(torch.int32),
        kv_indices=perm.to(torch.int64),
        custom_mask=torch.cat(masks),
        mask_indptr=mask_indptr,
        out_cache_loc=torch.arange(sum(prefix_lens), slots)[: len(prefix_lens) * n],
        max_extend_len=n,
    )
    return q, k_extend, v_extend, k_buffer, v_buffer, meta


def test_split_kv_attention_is_the_same_attention_in_another_rounding() -> None:
    q, ke, ve, kb, vb, meta = _verify_inputs([300, 17, 1])
    scale = 128**-0.5
    metadata = VerifyMetadata.build(
        meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.custom_mask, meta.mask_indptr, scale
    )
    reference = verify_attention_reference(metadata, q, ke, ve, kb, vb)
    for splits in (2, 4, 7):
        split = AttentionBackend("reference", "cpu", kv_splits=splits)(
            q, ke, ve, kb, vb, meta, scale
        )
        torch.testing.assert_close(split, reference, rtol=1e-5, atol=1e-5)
    # Equivalent, not bit-identical: otherwise it would be a second exact twin, not a floor.
    split4 = AttentionBackend("reference", "cpu", kv_splits=4)(q, ke, ve, kb, vb, meta, scale)
    assert not torch.equal(split4, reference)


def test_kv_splits_are_refused_where_they_mean_nothing() -> None:
    with pytest.raises(ValueError, match="reference attention backend"):
        EngineConfig(attention="op", attention_kv_splits=2)
    with pytest.raises(ValueError, match=">= 1"):
        EngineConfig(attention_kv_splits=0)
    with pytest.raises(ValueError, match="decode_step_delay_s"):
        EngineConfig(decode_step_delay_s=-1)


def _run(config: EngineConfig, n: int = 4):
    engine = Engine(config)
    engine.start()
    engine.wait_ready()
    try:
        started = time.perf_counter()
        results = [
            engine.generate(
                GenerationRequest(
                    rid=str(i),
                    input_ids=engine.tokenizer.encode(text),
                    max_new_tokens=12,
                    temperature=0.0,
                    return_logprob=True,
                ),
                timeout=120,
            )
            for i, text in enumerate(prompts(n))
        ]
        return results, time.perf_counter() - started
    finally:
        engine.stop()


def test_split_kv_engine_greedy_matches_with_tiny_logprob_drift() -> None:
    plain, _ = _run(EngineConfig(kv_pool_size=2048))
    split, _ = _run(EngineConfig(kv_pool_size=2048, attention_kv_splits=3))
    assert [r.output_ids for r in plain] == [r.output_ids for r in split]
    drift = [
        abs(a[0] - b[0])
        for p, s in zip(plain, split, strict=True)
        for a, b in zip(p.output_token_logprobs, s.output_token_logprobs, strict=True)
    ]
    assert 0 < max(drift) < 1e-4  # not bit-identical: a floor with noise in it


def test_decode_step_delay_slows_decoding_and_timings_say_so() -> None:
    fast, fast_s = _run(EngineConfig(kv_pool_size=2048, spec=_plain_decoding()), n=2)
    slow, slow_s = _run(
        EngineConfig(kv_pool_size=2048, spec=_plain_decoding(), decode_step_delay_s=0.05), n=2
    )
    assert [r.output_ids for r in fast] == [r.output_ids for r in slow]
    # 11 decode steps after the prefill's token, 50 ms each, per request, the requests one after
    # the other: a lower bound that holds however busy the machine is (a difference of two wall
    # times does not: a slow moment in the fast run eats into it).
    assert slow_s >= 2 * 11 * 0.05 > fast_s, (slow_s, fast_s)
    for r in slow:
        assert 0 < r.first_token_latency < r.e2e_latency
        assert r.e2e_latency - r.first_token_latency >= 11 * 0.05


def _plain_decoding():
    from kdtree_inference.engine.config import SpecConfig

    return SpecConfig(num_draft_tokens=1)
