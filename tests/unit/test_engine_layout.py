"""The verify op is called with exactly SGLang 0.5.23's target-verify layout.

An observer on the engine's attention backend records every call's arguments (the real op still
runs); the test checks them against the rules in DESIGN.md ("The SGLang contract").
"""

from __future__ import annotations

import torch

from kdtree_inference.engine.config import EngineConfig, SpecConfig
from kdtree_inference.engine.scheduler import Engine

N = 8
SPEC = SpecConfig(num_draft_tokens=N, topk=2, max_depth=5)


DEFAULT_PROMPTS = ["abc abc abc abc", "Hello, world! Hello,", "1 2 3 1 2 3 1 2", "zzzz"]


def _record_calls(
    attention: str, prompts: list[str] = DEFAULT_PROMPTS
) -> tuple[list[dict], list[list[int]]]:
    engine = Engine(EngineConfig(attention=attention, spec=SPEC, max_batch_size=4))
    engine.start()
    calls: list[dict] = []
    try:
        engine.wait_ready()

        def observe(args: dict) -> None:
            # Snapshot what the kernel would read: the pool rows at out_cache_loc right now.
            snap = dict(args)
            snap["k_buffer_at_out_loc"] = args["k_buffer"][args["out_cache_loc"]].clone()
            snap["custom_mask"] = (
                None if args["custom_mask"] is None else args["custom_mask"].clone()
            )
            snap["kv_indices"] = args["kv_indices"].clone()
            calls.append(snap)

        engine.model.attention.observers.append(observe)
        outputs = [r.output_ids for r in engine.generate_greedy(prompts, 12, timeout=120)]
    finally:
        engine.stop()
    return calls, outputs


def test_op_sees_sglang_verify_layout() -> None:
    calls, _ = _record_calls("op")
    verify_calls = [c for c in calls if c["custom_mask"] is not None]
    prefill_calls = [c for c in calls if c["custom_mask"] is None]
    assert verify_calls and prefill_calls
    multi_request = 0
    for c in verify_calls:
        q, k, v = c["q"], c["k_extend"], c["v_extend"]
        k_buf, v_buf = c["k_buffer"], c["v_buffer"]
        batch = c["qo_indptr"].numel() - 1
        multi_request += batch > 1
        total = batch * N
        # Shapes and dtypes.
        assert q.shape == (total, 8, 576) and q.dtype == torch.float32
        assert k.shape == (total, 1, 576) and v.shape == (total, 1, 512)
        assert k_buf.shape[1:] == (1, 576) and v_buf.shape == (k_buf.shape[0], 1, 512)
        # v_buffer is the strided view of k_buffer's first 512 columns, not a copy.
        assert v_buf.data_ptr() == k_buf.data_ptr() and v_buf.stride() == k_buf.stride()
        assert k_buf.stride() == (576, 576, 1)
        # qo_indptr = arange(B+1) * N; kv_indptr/kv_indices cover the PREFIX only.
        assert c["qo_indptr"].dtype == torch.int32
        assert torch.equal(c["qo_indptr"], torch.arange(batch + 1, dtype=torch.int32) * N)
        assert c["kv_indices"].dtype == torch.int64 and c["kv_indptr"].dtype == torch.int32
        prefix = torch.diff(c["kv_indptr"]).long()
        assert int(c["kv_indptr"][-1]) == c["kv_indices"].numel()
        out_loc = c["out_cache_loc"]
        assert out_loc.numel() == total
        assert not set(out_loc.tolist()) & set(c["kv_indices"].tolist())
        assert 0 not in c["kv_indices"].tolist()  # slot 0 is SGLang's padding slot
        # The draft tokens' KV was written to out_cache_loc before attention ran.
        assert torch.equal(c["k_buffer_at_out_loc"], k)
        # Flat mask: per request N rows x (prefix + N) columns, row-major; mask_indptr cumsum.
        mask, mask_indptr = c["custom_mask"], c["mask_indptr"]
        assert mask.dim() == 1 and mask.dtype == torch.bool
        assert mask_indptr.dtype == torch.int64
        expect_indptr = torch.zeros(batch + 1, dtype=torch.int64)
        expect_indptr[1:] = torch.cumsum(N * (prefix + N), 0)
        assert torch.equal(mask_indptr, expect_indptr) and mask.numel() == int(expect_indptr[-1])
        for b in range(batch):
            p = int(prefix[b])
            block = mask[int(mask_indptr[b]) : int(mask_indptr[b + 1])].view(N, p + N)
            assert block[:, :p].all()  # prefix columns all visible
            tree = block[:, p:]
            assert tree.diagonal().all()  # self is visible
            assert not tree.triu(1).any()  # only ancestors (earlier nodes) are visible
            assert tree[:, 0].all()  # the root is everyone's ancestor
            assert tree.sum() > N  # a real tree, not just the diagonal
    assert multi_request > 0  # some verify forwards batched several requests


def test_prefill_runs_causal_extends_of_at_most_64_tokens() -> None:
    calls, _ = _record_calls("op", prompts=["x" * 150])
    prefill = [c for c in calls if c["custom_mask"] is None]
    sizes = [c["q"].shape[0] for c in prefill[::2]]  # two layers per chunk
    assert sizes == [64, 64, 23]  # BOS + 150 bytes, 64 per chunk
    done = 0
    for c in prefill[::2]:
        t = c["q"].shape[0]
        assert torch.equal(c["qo_indptr"], torch.tensor([0, t], dtype=torch.int32))
        # The prefix of a chunk is every earlier chunk, addressed through kv_indices.
        assert torch.equal(c["kv_indptr"], torch.tensor([0, done], dtype=torch.int32))
        assert c["kv_indices"].numel() == done and c["mask_indptr"] is None
        done += t


def test_kv_indices_are_fragmented() -> None:
    calls, _ = _record_calls("op")
    longest = max(
        (c for c in calls if c["custom_mask"] is not None), key=lambda c: c["kv_indices"].numel()
    )
    first_request = longest["kv_indices"][: int(longest["kv_indptr"][1])]
    steps = torch.diff(first_request)
    # Scattered slots: a kernel assuming contiguous KV would read the wrong rows.
    assert (steps != 1).float().mean() > 0.5


def test_reference_and_op_backends_agree_on_outputs() -> None:
    _, op_out = _record_calls("op")
    _, ref_out = _record_calls("reference")
    assert op_out == ref_out
