"""KDTREE_INJECT_FAULT on the reference engine: each fault changes attention (or the weights) by
exactly the intended amount, checked against a dense attention written out independently; unset,
the engine is the stock one, bit for bit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from fault_support import dense_attention, first_hidden

from kdtree_inference.engine.attention import AttentionBackend, ExtendMetadata
from kdtree_inference.engine.config import EngineConfig, ModelConfig
from kdtree_inference.engine.fault_injection import (
    FaultyAttentionBackend,
    attention_backend,
    faulty_weights,
)
from kdtree_inference.engine.model import seeded_weights
from kdtree_inference.engine.scheduler import Engine
from kdtree_inference.faults import Fault, FaultSpecError, parse_fault
from kdtree_verify.testing import random_tree_parents, tree_visibility

HEADS, N = 4, 5
PREFIXES = [7, 12]
SCALE = 0.125


def verify_forward(seed: int = 0):
    """Two requests' verify forward in SGLang's layout, random trees, scattered prefix slots."""
    gen = torch.Generator().manual_seed(seed)
    pool = 64
    k_buffer = torch.randn(pool, 1, 576, generator=gen)
    slots = torch.randperm(pool, generator=gen)
    kv_indices, visibles, masks, start = [], [], [], 0
    for prefix in PREFIXES:
        kv_indices.append(slots[start : start + prefix])
        start += prefix
        vis = tree_visibility(random_tree_parents(N, gen))
        visibles.append(vis)
        block = torch.ones(N, prefix + N, dtype=torch.bool)
        block[:, prefix:] = vis
        masks.append(block.flatten())
    total = N * len(PREFIXES)
    k_extend = torch.randn(total, 1, 576, generator=gen)
    meta = ExtendMetadata(
        qo_indptr=torch.arange(0, total + 1, N, dtype=torch.int32),
        kv_indptr=torch.tensor([0, PREFIXES[0], sum(PREFIXES)], dtype=torch.int32),
        kv_indices=torch.cat(kv_indices).long(),
        custom_mask=torch.cat(masks),
        mask_indptr=torch.tensor([0, N * (PREFIXES[0] + N), sum(N * (p + N) for p in PREFIXES)]),
        out_cache_loc=torch.zeros(total, dtype=torch.int64),
        max_extend_len=N,
    )
    args = (
        torch.randn(total, HEADS, 576, generator=gen),
        k_extend,
        k_extend[..., :512].clone(),
        k_buffer,
        k_buffer[..., :512],
    )
    requests = [(b * N, N, kv_indices[b].tolist(), visibles[b]) for b in range(len(PREFIXES))]
    return args, meta, requests


def test_specs_parse_and_malformed_ones_are_refused():
    assert parse_fault(None) is None and parse_fault("  ") is None
    assert parse_fault("scale:0.001") == Fault("scale", 0.001)
    assert parse_fault("weight:1:1e-4") == Fault("weight", 1e-4, layer=1, seed=0)
    assert parse_fault("weight:0:0.01:7").seed == 7
    assert parse_fault("kv_drop:16") == Fault("kv_drop", 16.0)
    assert parse_fault("tree_mask:0").index == 0
    for spec in ("scale:0.001", "weight:1:0.0001:0", "kv_drop:16", "tree_mask:3"):
        assert parse_fault(spec).describe() == spec
    for bad in (
        "bogus",
        "scale",
        "scale:x",
        "scale:0",
        "scale:-1",
        "scale:nan",
        "kv_drop:-1",
        "kv_drop:1.5",
        "tree_mask:",
        "weight:1",
        "weight:-1:0.1",
        "weight:1:0",
        "weight:1:inf",
        "scale:0.1:2",
    ):
        with pytest.raises(FaultSpecError, match="KDTREE_INJECT_FAULT"):
            parse_fault(bad)


def test_unset_is_the_stock_backend_and_weights():
    assert type(attention_backend("reference", "cpu", None)) is AttentionBackend
    weights = seeded_weights(ModelConfig())
    assert faulty_weights(weights, None) is weights


def test_scale_fault_multiplies_the_softmax_scale():
    args, meta, requests = verify_forward()
    faulty = FaultyAttentionBackend("reference", "cpu", parse_fault("scale:0.01"))(
        *args, meta, SCALE
    )
    expected = dense_attention(*args, requests, SCALE * 1.01)
    stock = AttentionBackend("reference", "cpu")(*args, meta, SCALE)
    torch.testing.assert_close(faulty, expected, atol=2e-5, rtol=1e-5)
    assert (faulty - stock).abs().max() > 1e-3
    # Bit-identical to the stock backend called with the scaled factor.
    assert torch.equal(faulty, AttentionBackend("reference", "cpu")(*args, meta, SCALE * 1.01))


@pytest.mark.parametrize("position", [0, 9])
def test_kv_drop_masks_that_row_out_where_the_prefix_holds_it(position):
    args, meta, requests = verify_forward()
    fault = parse_fault(f"kv_drop:{position}")
    faulty = FaultyAttentionBackend("reference", "cpu", fault)(*args, meta, SCALE)
    dropped = [
        (s, n, [x for i, x in enumerate(slots) if i != position], vis)
        for s, n, slots, vis in requests
    ]
    torch.testing.assert_close(faulty, dense_attention(*args, dropped, SCALE), atol=2e-5, rtol=0)
    stock = AttentionBackend("reference", "cpu")(*args, meta, SCALE)
    for b, prefix in enumerate(PREFIXES):
        rows = slice(b * N, (b + 1) * N)
        if position < prefix:
            assert (faulty[rows] - stock[rows]).abs().max() > 1e-4
        else:  # position 9 is past request 0's prefix of 7: untouched
            assert torch.equal(faulty[rows], stock[rows])


@pytest.mark.parametrize("row", [0, 2])
def test_tree_mask_fault_shows_one_extra_node_to_that_row(row):
    args, meta, requests = verify_forward()
    faulty = FaultyAttentionBackend("reference", "cpu", parse_fault(f"tree_mask:{row}"))(
        *args, meta, SCALE
    )
    widened = []
    for s, n, slots, vis in requests:
        vis = vis.clone()
        extra = first_hidden(vis, row)
        assert extra is not None  # row 0 (the root) never sees its children; row 2 sees < 3
        vis[row, extra] = True
        widened.append((s, n, slots, vis))
    torch.testing.assert_close(faulty, dense_attention(*args, widened, SCALE), atol=2e-5, rtol=0)
    stock = AttentionBackend("reference", "cpu")(*args, meta, SCALE)
    changed = (faulty - stock).abs().amax(dim=(1, 2)) > 0
    assert changed.tolist() == [i % N == row for i in range(len(changed))]


def test_weight_fault_perturbs_one_layer_by_the_relative_size():
    cfg = ModelConfig()
    weights = seeded_weights(cfg)
    faulty = faulty_weights(weights, parse_fault("weight:1:0.001"))
    for name, w in weights.items():
        if name.startswith("model.layers.1.") and w.dim() == 2:
            rel = float((faulty[name] - w).norm() / w.norm())
            assert rel == pytest.approx(0.001, rel=1e-3), name
        else:
            assert faulty[name] is w, name
    again = faulty_weights(weights, parse_fault("weight:1:0.001"))
    assert all(torch.equal(again[k], faulty[k]) for k in weights)  # seeded
    other_seed = faulty_weights(weights, parse_fault("weight:1:0.001:1"))
    assert not torch.equal(
        other_seed["model.layers.1.mlp.up_proj.weight"], faulty["model.layers.1.mlp.up_proj.weight"]
    )


def _greedy(fault: Fault | None) -> list[float]:
    engine = Engine(EngineConfig(injected_fault=fault, kv_pool_size=4096))
    engine.start()
    try:
        engine.wait_ready()
        (result,) = engine.generate_greedy(
            ["The quick brown fox"], 12, top_logprobs_num=1, timeout=300
        )
    finally:
        engine.stop()
    return [lp for lp, _ in result.output_token_logprobs]


def test_engine_output_moves_with_the_fault_and_is_stock_without_one():
    stock = _greedy(None)
    assert _greedy(None) == stock  # deterministic, so the comparisons below mean something
    small = _greedy(parse_fault("scale:0.0001"))
    large = _greedy(parse_fault("scale:0.001"))
    drift_small = max(abs(a - b) for a, b in zip(stock, small, strict=True))
    drift_large = max(abs(a - b) for a, b in zip(stock, large, strict=True))
    assert 0 < drift_small < drift_large  # graded: ten times the fault, more drift


def test_server_refuses_a_malformed_fault_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "kdtree_inference.engine", "--port", "0"],
        env={**__import__("os").environ, "KDTREE_INJECT_FAULT": "scale:abc"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "KDTREE_INJECT_FAULT='scale:abc'" in proc.stderr


def test_a_tree_mask_row_past_the_tree_is_refused() -> None:
    """Before: ``tree_mask:R`` with R past the tree's rows started, changed nothing, and was
    graded as a fault every candidate passes with."""
    from kdtree_inference.engine.config import SpecConfig
    from kdtree_inference.faults import parse_fault

    spec = SpecConfig(num_draft_tokens=8)
    EngineConfig(spec=spec, injected_fault=parse_fault("tree_mask:7"))
    with pytest.raises(ValueError, match="tree_mask row 8 is past the tree's 8 rows"):
        EngineConfig(spec=spec, injected_fault=parse_fault("tree_mask:8"))
