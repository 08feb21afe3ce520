"""KdtreeTritonAttnBackend against SGLang 0.5.23's real TritonAttnBackend, on CPU.

Both backends run SGLang's own metadata code (eager ``init_forward_metadata`` and the CUDA-graph
path ``init_cuda_graph_state`` / ``init_forward_metadata_out_graph``) over SGLang's real MLA KV
pool, and the stock path runs SGLang's Triton ``extend_attention_fwd`` in Triton's interpreter
(float32; tests/conftest.py sets TRITON_INTERPRET=1). ``on`` runs kdtree's CPU op. How the backend
is assembled from stand-ins is described in ``kdtree_inference.sglang.testing``.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip(
        "SGLang's Triton kernels run interpreted only on a CPU machine (tests/gpu covers CUDA)",
        allow_module_level=True,
    )

from prometheus_client import CollectorRegistry
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from kdtree_inference.sglang import testing
from kdtree_inference.sglang.backend import KdtreeTritonAttnBackend
from kdtree_inference.sglang.forward_state import Phase
from kdtree_inference.sglang.modes import VerifyMode, VerifySettings
from kdtree_inference.sglang.telemetry import PUBLISH_EVENT

HEADS = 2
DRAFT = 3
PREFIXES = [5, 17]
LAYERS = [0, 1]
ELEMENTS_PER_LAYER = len(PREFIXES) * DRAFT * HEADS * 512


@pytest.fixture(autouse=True)
def _sglang_context():
    with testing.sglang_cpu_context():
        yield


def make_runner(**kwargs):
    return testing.make_model_runner(num_heads=HEADS, num_draft=DRAFT, **kwargs)


def make_ours(runner, settings: VerifySettings, registry=None):
    return testing.make_backend(
        KdtreeTritonAttnBackend,
        runner,
        kdtree_settings=settings,
        kdtree_registry=registry or CollectorRegistry(),
    )


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"tp_rank": "0", **labels})
    return 0.0 if value is None else value


class Pair:
    """A stock TritonAttnBackend and ours, over identical pools, fed identical batches."""

    def __init__(
        self,
        settings: VerifySettings,
        mask: str = "tree",
        forward: str = "target_verify",
        **runner_kwargs,
    ):
        self.forward = forward
        self.registry = CollectorRegistry()
        self.stock_runner = make_runner(**runner_kwargs)
        self.ours_runner = make_runner(**runner_kwargs)
        self.stock = testing.make_backend(TritonAttnBackend, self.stock_runner)
        self.ours = make_ours(self.ours_runner, settings, self.registry)
        self.mask = mask
        self.layers = {i: testing.make_layer(i, HEADS) for i in LAYERS}

    def batches(self, prefixes=PREFIXES, seed: int = 1):
        def make(runner):
            return testing.make_verify_batch(
                runner,
                prefixes,
                DRAFT,
                HEADS,
                LAYERS,
                mask=self.mask,
                seed=seed,
                forward=self.forward,
            )

        return make(self.stock_runner), make(self.ours_runner)

    def eager_step(self, prefixes=PREFIXES, seed: int = 1, layers=None):
        stock_batch, ours_batch = self.batches(prefixes, seed)
        self.stock.init_forward_metadata(stock_batch.forward_batch)
        self.ours.init_forward_metadata(ours_batch.forward_batch)
        return self.run_layers(stock_batch, ours_batch, layers or self.layers)

    def run_layers(self, stock_batch, ours_batch, layers):
        outs = []
        for layer_id, layer in layers.items():
            stock = self.stock.forward_extend(
                *stock_batch.qkv[layer_id], layer, stock_batch.forward_batch
            )
            ours = self.ours.forward_extend(
                *ours_batch.qkv[layer_id], layer, ours_batch.forward_batch
            )
            outs.append((stock, ours))
        return outs

    def pools_equal(self) -> bool:
        return all(
            torch.equal(
                self.stock.token_to_kv_pool.get_key_buffer(i),
                self.ours.token_to_kv_pool.get_key_buffer(i),
            )
            for i in LAYERS
        )


def test_off_is_stock_bit_for_bit():
    pair = Pair(VerifySettings(mode=VerifyMode.OFF))
    for stock, ours in pair.eager_step():
        assert ours.dtype == stock.dtype and ours.shape == stock.shape
        assert torch.equal(ours, stock)
    assert pair.pools_equal()
    assert metric(pair.registry, "kdtree_verify_mode", mode="off") == 1
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 0
    assert metric(pair.registry, "kdtree_verify_steps_total") == 0


def test_a_mode_the_backend_does_not_know_is_refused_not_served_as_on():
    pair = Pair(VerifySettings(mode=VerifyMode.ON))
    pair.ours.kdtree_settings = dataclasses.replace(pair.ours.kdtree_settings, mode="shadow")
    with pytest.raises(AssertionError, match="shadow"):
        pair.eager_step()
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 0


@pytest.mark.parametrize("mask", ["tree", "chain", "causal"])
def test_on_serves_the_kernel_and_matches_stock(mask):
    pair = Pair(VerifySettings(mode=VerifyMode.ON), mask=mask)
    for stock, ours in pair.eager_step():
        assert ours.shape == stock.shape and ours.dtype == stock.dtype
        assert not torch.equal(ours, stock), "on must serve the kernel's result, not Triton's"
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    # The draft tokens' KV is written exactly as the stock backend writes it.
    assert pair.pools_equal()
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == len(LAYERS)
    assert metric(pair.registry, "kdtree_verify_steps_total") == 1
    assert metric(pair.registry, "kdtree_verify_graph_replays_total") == 0
    assert metric(pair.registry, "kdtree_verify_mode", mode="on") == 1


def test_validate_serves_stock_exactly_and_records_the_difference(caplog):
    pair = Pair(VerifySettings(mode=VerifyMode.VALIDATE, validate_every=1))
    for stock, ours in pair.eager_step():
        assert torch.equal(ours, stock)
    assert pair.pools_equal()
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == len(LAYERS)
    with caplog.at_level(logging.INFO, logger="kdtree.verify"):
        pair.ours.kdtree_flush()
    for layer_id in LAYERS:
        max_abs = metric(pair.registry, "kdtree_verify_max_abs_error", layer=str(layer_id))
        max_rel = metric(pair.registry, "kdtree_verify_max_rel_error", layer=str(layer_id))
        assert 0 < max_abs < 2e-5  # a real, small float32 difference between two algorithms
        assert 0 < max_rel < 1e-3
        over = metric(pair.registry, "kdtree_verify_over_tolerance_total", layer=str(layer_id))
        assert over == 0
    compared = metric(pair.registry, "kdtree_verify_compared_elements_total")
    assert compared == ELEMENTS_PER_LAYER * len(LAYERS)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(PUBLISH_EVENT)]
    assert len(lines) == 1
    payload = json.loads(lines[0][len(PUBLISH_EVENT) :])
    assert payload["mode"] == "validate" and payload["compared"] == compared
    assert payload["over_tolerance"] == 0 and payload["layers"] == len(LAYERS)


def test_validate_counts_elements_over_tolerance(caplog):
    # atol = rtol = 0: every element where the two float32 algorithms differ at all is counted.
    settings = VerifySettings(mode=VerifyMode.VALIDATE, validate_every=1, atol=0.0, rtol=0.0)
    pair = Pair(settings)
    outs = pair.eager_step()
    with caplog.at_level(logging.WARNING, logger="kdtree.verify"):
        pair.ours.kdtree_flush()
    over = sum(
        metric(pair.registry, "kdtree_verify_over_tolerance_total", layer=str(i)) for i in LAYERS
    )
    assert 0 < over <= ELEMENTS_PER_LAYER * len(LAYERS)
    assert any(PUBLISH_EVENT in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert all(torch.equal(stock, ours) for stock, ours in outs)


def test_publishes_every_n_steps_from_the_step_hook():
    pair = Pair(VerifySettings(mode=VerifyMode.VALIDATE, validate_every=2))
    layer0 = {0: pair.layers[0]}
    pair.eager_step(layers=layer0)  # step 1: records
    assert metric(pair.registry, "kdtree_verify_publishes_total") == 0
    pair.eager_step(seed=2, layers=layer0)  # step 2: snapshot of steps 1 (taken before running)
    pair.eager_step(seed=3, layers=layer0)  # step 3: the snapshot is collected and published
    assert metric(pair.registry, "kdtree_verify_publishes_total") == 1
    assert metric(pair.registry, "kdtree_verify_compared_elements_total") == ELEMENTS_PER_LAYER
    assert metric(pair.registry, "kdtree_verify_steps_total") == 3


def test_on_shadow_every_n_steps_in_eager_forwards():
    pair = Pair(VerifySettings(mode=VerifyMode.ON, shadow_every=2, validate_every=1000))
    layer0 = {0: pair.layers[0]}
    for step in range(1, 5):
        for stock, ours in pair.eager_step(seed=step, layers=layer0):
            torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    pair.ours.kdtree_flush()
    # Steps 2 and 4 ran the Triton shadow: two comparisons of layer 0.
    assert metric(pair.registry, "kdtree_verify_compared_elements_total") == 2 * ELEMENTS_PER_LAYER
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 4


def _pool_value_amax(backend) -> torch.Tensor:
    """max |value| per latent dimension of every layer's pool rows, [layers, 512]."""
    pool = backend.token_to_kv_pool
    return torch.stack(
        [pool.get_value_buffer(i).float().abs().reshape(-1, 512).amax(0) for i in LAYERS]
    )


def _step_scales(pair: Pair, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One eager step: (the recorder's value scale once the step's metadata is set up, the pool's
    amax at that moment), then the step's layers run."""
    stock_batch, ours_batch = pair.batches(seed=seed)
    pair.stock.init_forward_metadata(stock_batch.forward_batch)
    pair.ours.init_forward_metadata(ours_batch.forward_batch)
    recorder = pair.ours.kdtree_comparison.recorder
    rows = [i - recorder.first_layer_id for i in LAYERS]
    scales = (recorder.value_scale[rows].clone(), _pool_value_amax(pair.ours))
    pair.run_layers(stock_batch, ours_batch, pair.layers)
    return scales


def test_validate_rescans_the_pools_values_before_every_step():
    pair = Pair(VerifySettings(mode=VerifyMode.VALIDATE, validate_every=1000))
    for seed in (1, 2, 3):
        scale, pool_amax = _step_scales(pair, seed)
        assert pool_amax.max() > 0
        assert torch.equal(scale, pool_amax)


def test_on_rescans_the_pools_values_only_before_shadowed_steps():
    pair = Pair(VerifySettings(mode=VerifyMode.ON, shadow_every=2, validate_every=1000))
    scale, _ = _step_scales(pair, seed=1)  # not shadowed: never scanned
    assert not scale.any()
    shadowed, pool_amax = _step_scales(pair, seed=2)
    assert pool_amax.max() > 0
    assert torch.equal(shadowed, pool_amax)
    scale, _ = _step_scales(pair, seed=3)  # not shadowed: step 2's scan stays as it was
    assert torch.equal(scale, shadowed)


def unsupported_layers():
    return {
        "logit_cap": testing.make_layer(0, HEADS, logit_cap=30.0),
        "xai_temperature": testing.make_layer(1, HEADS, xai_temperature_len=4),
    }


def test_unsupported_layers_fall_back_to_stock_and_are_counted():
    pair = Pair(VerifySettings(mode=VerifyMode.ON))
    layers = unsupported_layers()
    by_id = {layer.layer_id: layer for layer in layers.values()}
    for stock, ours in pair.eager_step(layers=by_id):
        assert torch.equal(ours, stock)
    for reason in layers:
        assert metric(pair.registry, "kdtree_verify_fallbacks_total", reason=reason) == 1
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 0


def test_sinks_fall_back_to_stock_and_are_counted():
    pair = Pair(VerifySettings(mode=VerifyMode.ON))
    stock_batch, ours_batch = pair.batches()
    pair.stock.init_forward_metadata(stock_batch.forward_batch)
    pair.ours.init_forward_metadata(ours_batch.forward_batch)
    sinks = torch.full((HEADS,), 0.5)
    layer = pair.layers[0]
    stock = pair.stock.forward_extend(
        *stock_batch.qkv[0], layer, stock_batch.forward_batch, sinks=sinks
    )
    ours = pair.ours.forward_extend(
        *ours_batch.qkv[0], layer, ours_batch.forward_batch, sinks=sinks
    )
    assert torch.equal(ours, stock)
    assert metric(pair.registry, "kdtree_verify_fallbacks_total", reason="sinks") == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"layer": {"k_scale": torch.tensor(1.0)}}, "kv_scale"),  # scaled, not an fp8 pool
        ({"layer": {"sliding_window_size": 128}}, "sliding_window"),
        ({"layer": {"logit_cap": 50.0}}, "logit_cap"),
        ({"layer": {"is_cross_attention": True}}, "non_causal"),
        ({"layer": {"qk_head_dim": 192, "v_head_dim": 128}}, "non_mla"),
        ({"backend": {"page_size": 16}}, "page_size"),
        ({"backend": {"dcp_size": 2}}, "dcp"),
        ({"backend": {"use_mla": False}}, "non_mla"),
        ({"backend": {"use_sliding_window_kv_pool": True}}, "sliding_window"),
        ({"q_dtype": torch.bfloat16}, "kv_dtype"),  # a float32 pool read by bf16 q
        ({}, None),
    ],
)
def test_unsupported_reason_names_every_case(change, reason):
    backend = make_ours(make_runner(num_layers=1), VerifySettings(mode=VerifyMode.ON))
    backend.__dict__.update(change.get("backend", {}))
    layer = testing.make_layer(0, HEADS, **change.get("layer", {}))
    q = torch.zeros(DRAFT, HEADS * 576, dtype=change.get("q_dtype", torch.float32))
    k = torch.zeros(DRAFT, 1, 576)
    assert backend._kdtree_unsupported_reason(q, k, k[..., :512], layer, None, None, None) == reason


def test_forwards_other_than_target_verify_are_the_parents():
    pair = Pair(VerifySettings(mode=VerifyMode.ON))
    stock_batch, ours_batch = pair.batches()
    pair.stock.init_forward_metadata(stock_batch.forward_batch)
    pair.ours.init_forward_metadata(ours_batch.forward_batch)
    # The same metadata read as a draft-extend forward: the kernel must not take it.
    for batch in (stock_batch, ours_batch):
        batch.forward_batch.forward_mode = ForwardMode.DRAFT_EXTEND_V2
    for stock, ours in pair.run_layers(stock_batch, ours_batch, pair.layers):
        assert torch.equal(ours, stock)
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 0


def test_draft_runner_serves_draft_extend_unless_switched_off():
    runner = make_runner(is_draft_worker=True)
    backend = make_ours(runner, VerifySettings(mode=VerifyMode.ON))
    assert (backend.kdtree_role, backend.kdtree_active) == ("draft_extend", True)
    stock = make_ours(runner, VerifySettings(mode=VerifyMode.ON, draft_extend=False))
    assert not stock.kdtree_active
    assert stock.kdtree_recorder is None and stock.kdtree_shadow_gate is None


class GraphPair(Pair):
    """The CUDA-graph path: SGLang's static buffers, capture-time then replay-time metadata."""

    def __init__(self, settings: VerifySettings, **kwargs):
        super().__init__(settings, **kwargs)
        for backend in (self.stock, self.ours):
            backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4 * DRAFT)

    def capture(self, prefixes=PREFIXES, seed: int = 1):
        stock_batch, ours_batch = self.batches(prefixes, seed)
        self.stock.init_forward_metadata_out_graph(stock_batch.forward_batch, in_capture=True)
        self.ours.init_forward_metadata_out_graph(ours_batch.forward_batch, in_capture=True)
        return stock_batch, ours_batch

    def replay_metadata(self, prefixes, seed: int):
        stock_batch, ours_batch = self.batches(prefixes, seed)
        self.stock.init_forward_metadata_out_graph(stock_batch.forward_batch)
        self.ours.init_forward_metadata_out_graph(ours_batch.forward_batch)
        return stock_batch, ours_batch


def test_graph_capture_references_sglang_static_buffers_and_replay_counts_routes():
    pair = GraphPair(VerifySettings(mode=VerifyMode.ON))
    stock_batch, ours_batch = pair.capture()
    inputs = pair.ours.kdtree_forward.inputs
    # Marshaling made no copies: the kernel reads SGLang's own capture buffers.
    assert inputs.kv_indptr.data_ptr() == pair.ours.kv_indptr.data_ptr()
    assert inputs.qo_indptr.data_ptr() == pair.ours.qo_indptr.data_ptr()
    assert inputs.kv_indices.data_ptr() == pair.ours.cuda_graph_kv_indices.data_ptr()
    assert inputs.custom_mask.data_ptr() == pair.ours.verify_mask.buffer.data_ptr()
    assert inputs.mask_indptr.data_ptr() == pair.ours.mask_indptr.data_ptr()
    # Layer 0 on the kernel, layer 1 with a logit cap (a fallback); warm-up and capture runs
    # go through the same calls twice.
    layers = {0: pair.layers[0], 1: testing.make_layer(1, HEADS, logit_cap=30.0)}
    for _ in range(2):
        for stock, ours in pair.run_layers(stock_batch, ours_batch, layers):
            torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    # Capture runs are not serving steps.
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 0
    assert metric(pair.registry, "kdtree_verify_fallbacks_total", reason="logit_cap") == 0
    assert metric(pair.registry, "kdtree_verify_steps_total") == 0
    # Each replay counts what the captured graph does, once.
    for seed in (2, 3):
        pair.replay_metadata([9, 4], seed)
    assert metric(pair.registry, "kdtree_verify_steps_total") == 2
    assert metric(pair.registry, "kdtree_verify_graph_replays_total") == 2
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 2
    assert metric(pair.registry, "kdtree_verify_fallbacks_total", reason="logit_cap") == 2


def test_a_recaptured_graph_replays_with_its_new_routes():
    pair = GraphPair(VerifySettings(mode=VerifyMode.ON))
    stock_batch, ours_batch = pair.capture()
    pair.run_layers(stock_batch, ours_batch, {0: pair.layers[0]})
    pair.replay_metadata([9, 4], seed=2)
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 1
    # The same batch size captured again (SGLang re-captures its graphs after a memory resize,
    # say), now through both layers: its replays count the new graph's calls, not the old one's.
    stock_batch, ours_batch = pair.capture()
    pair.run_layers(stock_batch, ours_batch, pair.layers)
    for seed in (3, 4):
        pair.replay_metadata([9, 4], seed)
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 1 + 2 * len(LAYERS)
    assert metric(pair.registry, "kdtree_verify_graph_replays_total") == 3


def test_graph_replay_metadata_feeds_the_kernel_new_batches():
    pair = GraphPair(VerifySettings(mode=VerifyMode.ON))
    pair.capture()
    # New prefixes and masks, same batch size: only the static buffers change.
    stock_batch, ours_batch = pair.replay_metadata([11, 2], seed=7)
    # Python reruns here what the graph would replay: the same calls reading the same buffers.
    pair.ours.kdtree_forward.phase = Phase.CAPTURE
    for stock, ours in pair.run_layers(stock_batch, ours_batch, pair.layers):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    assert pair.pools_equal()


def test_graph_shadow_gate_selects_steps_on_the_device():
    settings = VerifySettings(mode=VerifyMode.ON, shadow_every=2, validate_every=1000)
    pair = GraphPair(settings)
    stock_batch, ours_batch = pair.capture()
    layer0 = {0: pair.layers[0]}
    # Capture (and a closed gate): Triton's shadow call is recorded but compares nothing.
    for stock, ours in pair.run_layers(stock_batch, ours_batch, layer0):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    pair.ours.kdtree_flush()
    assert metric(pair.registry, "kdtree_verify_compared_elements_total") == 0
    gate = pair.ours.kdtree_shadow_gate
    # Replay of step 1: not a shadow step, the gate stays closed and the shadow indptrs are zero.
    stock_batch, ours_batch = pair.replay_metadata(PREFIXES, seed=1)
    assert not bool(gate.open) and int(gate.kv_indptr.abs().sum()) == 0
    # Replay of step 2: selected. Rerun the captured calls (as the graph would) with the gate open.
    stock_batch, ours_batch = pair.replay_metadata(PREFIXES, seed=1)
    assert bool(gate.open)
    assert torch.equal(gate.kv_indptr[:3], pair.ours.kv_indptr[:3].long())
    pair.ours.kdtree_forward.phase = Phase.CAPTURE
    for stock, ours in pair.run_layers(stock_batch, ours_batch, layer0):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    pair.ours.kdtree_flush()
    assert metric(pair.registry, "kdtree_verify_compared_elements_total") == ELEMENTS_PER_LAYER
    assert 0 < metric(pair.registry, "kdtree_verify_max_abs_error", layer="0") < 2e-5


def test_deterministic_inference_is_served_and_shadowed_against_the_unified_kernel():
    """--enable-deterministic-inference: stock runs SGLang's unified 1-stage kernel; `on` serves
    the kdtree kernel, and the captured shadow call (through the unified path) still gates."""
    settings = VerifySettings(mode=VerifyMode.ON, shadow_every=2, validate_every=1000)
    pair = GraphPair(settings)
    for backend in (pair.stock, pair.ours):
        backend.enable_deterministic = True  # what the server flag sets in __init__
    stock_batch, ours_batch = pair.capture()
    layer0 = {0: pair.layers[0]}
    for stock, ours in pair.run_layers(stock_batch, ours_batch, layer0):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    pair.ours.kdtree_flush()
    assert metric(pair.registry, "kdtree_verify_compared_elements_total") == 0
    pair.ours.kdtree_shadow_gate.set(True, pair.ours.qo_indptr[:3], pair.ours.kv_indptr[:3])
    for stock, ours in pair.run_layers(stock_batch, ours_batch, layer0):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    pair.ours.kdtree_flush()
    assert metric(pair.registry, "kdtree_verify_compared_elements_total") == ELEMENTS_PER_LAYER
    assert 0 < metric(pair.registry, "kdtree_verify_max_abs_error", layer="0") < 2e-5


# ----------------------------------------------------------------- EAGLE's draft extend


def draft_pair(mode: VerifyMode, **settings) -> Pair:
    return Pair(VerifySettings(mode=mode, **settings), forward="draft_extend", is_draft_worker=True)


def test_draft_extend_on_serves_the_kernel_and_matches_stock():
    pair = draft_pair(VerifyMode.ON)
    for stock, ours in pair.eager_step():
        assert not torch.equal(ours, stock), "on must serve the kernel's result, not Triton's"
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    assert pair.pools_equal()
    assert metric(pair.registry, "kdtree_draft_extend_steps_total") == 1
    assert metric(pair.registry, "kdtree_draft_extend_kernel_calls_total") == len(LAYERS)
    # Draft-extend forwards never count as target-verify steps.
    assert metric(pair.registry, "kdtree_verify_steps_total") == 0


def test_draft_extend_validate_serves_stock_and_measures():
    pair = draft_pair(VerifyMode.VALIDATE, validate_every=1)
    for stock, ours in pair.eager_step():
        assert torch.equal(ours, stock)
    pair.ours.kdtree_flush()
    assert metric(pair.registry, "kdtree_draft_extend_compared_elements_total") == (
        len(LAYERS) * ELEMENTS_PER_LAYER
    )
    assert metric(pair.registry, "kdtree_draft_extend_over_tolerance_total", layer="0") == 0


def test_draft_extend_stays_stock_with_the_switch_off_or_on_a_target_verify_forward():
    pair = draft_pair(VerifyMode.ON, draft_extend=False)
    for stock, ours in pair.eager_step():
        assert torch.equal(ours, stock)
    assert metric(pair.registry, "kdtree_draft_extend_kernel_calls_total") == 0
    # A draft runner's backend never takes a target-verify forward, whatever the switch says.
    pair = Pair(VerifySettings(mode=VerifyMode.ON), is_draft_worker=True)
    for stock, ours in pair.eager_step():
        assert torch.equal(ours, stock)
    assert metric(pair.registry, "kdtree_draft_extend_kernel_calls_total") == 0


def test_target_runner_leaves_draft_extend_forwards_stock():
    pair = Pair(VerifySettings(mode=VerifyMode.ON), forward="draft_extend")
    for stock, ours in pair.eager_step():
        assert torch.equal(ours, stock)
    assert metric(pair.registry, "kdtree_verify_kernel_calls_total") == 0


def test_draft_extend_graph_capture_and_replay_match_stock():
    pair = GraphPair(
        VerifySettings(mode=VerifyMode.ON), forward="draft_extend", is_draft_worker=True
    )
    assert pair.ours.num_draft_tokens == DRAFT
    stock_batch, ours_batch = pair.capture()
    for stock, ours in pair.run_layers(stock_batch, ours_batch, pair.layers):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    assert metric(pair.registry, "kdtree_draft_extend_steps_total") == 0  # capture is not a step
    # A replay counts the captured graph's kernel calls, then runs on the refreshed buffers.
    stock_batch, ours_batch = pair.replay_metadata([11, 6], seed=5)
    assert metric(pair.registry, "kdtree_draft_extend_graph_replays_total") == 1
    assert metric(pair.registry, "kdtree_draft_extend_kernel_calls_total") == len(LAYERS)
    for stock, ours in pair.run_layers(stock_batch, ours_batch, pair.layers):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)


def test_graph_replay_keys_on_batch_size_not_the_length_of_a_padded_buffer():
    """SGLang's draft-extend graph runner replays with its whole req_pool_indices buffer (all
    max_bs rows) and batch_size = the graph's batch: the plan of that graph must be refreshed."""
    pair = GraphPair(
        VerifySettings(mode=VerifyMode.ON), forward="draft_extend", is_draft_worker=True
    )
    captured = pair.capture()
    pair.run_layers(*captured, pair.layers)  # the captured graph's layer calls
    stock_batch, ours_batch = pair.batches([11, 6], seed=5)
    for batch in (stock_batch, ours_batch):
        rows = batch.forward_batch.req_pool_indices
        batch.forward_batch.req_pool_indices = torch.cat([rows, rows.new_zeros(2)])
    pair.stock.init_forward_metadata_out_graph(stock_batch.forward_batch)
    pair.ours.init_forward_metadata_out_graph(ours_batch.forward_batch)
    assert metric(pair.registry, "kdtree_draft_extend_kernel_calls_total") == len(LAYERS)
    for stock, ours in pair.run_layers(stock_batch, ours_batch, pair.layers):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", [VerifyMode.ON, VerifyMode.VALIDATE])
def test_dflash_causal_block_under_graphs_matches_stock(mode):
    """DFlash's target verify (custom_mask None: a causal block) on the CUDA-graph path: the
    capture-time inputs carry no mask, so the kernel runs causally, and a replay with new
    prefixes serves what stock serves."""
    pair = GraphPair(VerifySettings(mode=mode), mask="causal")
    stock_batch, ours_batch = pair.capture()
    inputs = pair.ours.kdtree_forward.inputs
    assert inputs.custom_mask is None and inputs.mask_indptr is None
    for stock, ours in pair.run_layers(stock_batch, ours_batch, pair.layers):
        torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    stock_batch, ours_batch = pair.replay_metadata([13, 1], seed=5)
    # Rerun the captured calls on the refreshed buffers.
    pair.ours.kdtree_forward.phase = Phase.CAPTURE
    for stock, ours in pair.run_layers(stock_batch, ours_batch, pair.layers):
        if mode is VerifyMode.VALIDATE:
            assert torch.equal(ours, stock)
        else:
            torch.testing.assert_close(ours, stock, atol=2e-5, rtol=1e-5)
    assert pair.pools_equal()
