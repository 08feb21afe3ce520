"""KDTREE_INJECT_FAULT in the SGLang backend (KDTREE_VERIFY=on), on CPU with SGLang's real
metadata code and MLA pool: each fault changes the kernel path's verify attention by exactly the
intended amount (checked against a dense attention over the pool, written out independently);
unset, the backend is unchanged; bad values and wrong modes are refused by name."""

from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CPU-only: SGLang's metadata code on a CPU pool", allow_module_level=True)

from fault_support import dense_attention, first_hidden
from prometheus_client import CollectorRegistry

from kdtree_inference.faults import parse_fault
from kdtree_inference.sglang import testing
from kdtree_inference.sglang.backend import KdtreeTritonAttnBackend
from kdtree_inference.sglang.fault_injection import FaultNeedsEagerError, faulty_inputs
from kdtree_inference.sglang.forward_state import Phase
from kdtree_inference.sglang.modes import SettingsError, VerifyMode, VerifySettings

HEADS, DRAFT, PREFIXES, LAYER = 2, 4, [6, 15], 0
SCALING = 0.1352


@pytest.fixture(autouse=True)
def _sglang_context():
    with testing.sglang_cpu_context():
        yield


def run_on(fault: str | None, scaling: float = SCALING):
    """One eager verify step of layer 0 with KDTREE_VERIFY=on (and ``fault``): (output, batch,
    backend). Every call builds the same pool and batch (seeded)."""
    runner = testing.make_model_runner(num_heads=HEADS, num_draft=DRAFT)
    settings = VerifySettings(mode=VerifyMode.ON, fault=parse_fault(fault))
    backend = testing.make_backend(
        KdtreeTritonAttnBackend,
        runner,
        kdtree_settings=settings,
        kdtree_registry=CollectorRegistry(),
    )
    batch = testing.make_verify_batch(runner, PREFIXES, DRAFT, HEADS, [LAYER])
    backend.init_forward_metadata(batch.forward_batch)
    layer = testing.make_layer(LAYER, HEADS, scaling=scaling)
    out = backend.forward_extend(*batch.qkv[LAYER], layer, batch.forward_batch)
    return out.view(-1, HEADS, 512), batch, backend


def expected(batch, backend, scaling=SCALING, drop: int | None = None, extra_row=None):
    """Dense attention of the batch over the pool, with row ``drop`` of each prefix left out
    or draft token ``extra_row`` shown the first node it does not see."""
    pool = backend.token_to_kv_pool
    meta = backend.forward_metadata
    kv_indptr, mask = meta.kv_indptr.tolist(), batch.forward_batch.spec_info.custom_mask
    q, k, v = batch.qkv[LAYER]
    requests, mask_start = [], 0
    for b, prefix in enumerate(PREFIXES):
        slots = meta.kv_indices[kv_indptr[b] : kv_indptr[b + 1]].tolist()
        block = mask[mask_start : mask_start + DRAFT * (prefix + DRAFT)].view(DRAFT, -1)
        mask_start += block.numel()
        visible = block[:, prefix:].clone()
        if drop is not None and drop < prefix:
            del slots[drop]
        if extra_row is not None:
            visible[extra_row, first_hidden(visible, extra_row)] = True
        requests.append((b * DRAFT, DRAFT, slots, visible))
    return dense_attention(
        q.view(-1, HEADS, 576),
        k,
        v,
        pool.get_key_buffer(LAYER),
        pool.get_value_buffer(LAYER),
        requests,
        scaling,
    )


def test_settings_read_the_fault_and_refuse_bad_ones():
    on = {"KDTREE_VERIFY": "on"}
    assert VerifySettings.from_env(on).fault is None
    settings = VerifySettings.from_env({**on, "KDTREE_INJECT_FAULT": "kv_drop:3"})
    assert settings.fault == parse_fault("kv_drop:3")
    assert "FAULT INJECTED KDTREE_INJECT_FAULT=kv_drop:3" in settings.describe()
    refused = {
        "scale:two": "expected weight:LAYER",
        "weight:0:0.01": "make_model.py --perturb",
    }
    for value, why in refused.items():
        with pytest.raises(SettingsError, match=why):
            VerifySettings.from_env({**on, "KDTREE_INJECT_FAULT": value})
    for mode in ("off", "validate"):
        with pytest.raises(SettingsError, match="needs KDTREE_VERIFY=on"):
            VerifySettings.from_env({"KDTREE_VERIFY": mode, "KDTREE_INJECT_FAULT": "scale:0.1"})


def test_unset_leaves_the_kernel_path_as_it_was():
    out, batch, backend = run_on(None)
    assert backend.kdtree_fault is None
    again, _, _ = run_on(None)
    assert torch.equal(out, again)
    torch.testing.assert_close(out, expected(batch, backend), atol=2e-5, rtol=0)


def test_scale_fault_is_the_kernel_with_the_scaled_softmax():
    faulty, _, _ = run_on("scale:0.01")
    plain, _, _ = run_on(None)
    scaled, _, _ = run_on(None, scaling=SCALING * 1.01)
    assert torch.equal(faulty, scaled)
    assert (faulty - plain).abs().max() > 1e-4


@pytest.mark.parametrize("position", [0, 10])
def test_kv_drop_fault_masks_that_prefix_row_out(position):
    faulty, batch, backend = run_on(f"kv_drop:{position}")
    plain, _, _ = run_on(None)
    torch.testing.assert_close(faulty, expected(batch, backend, drop=position), atol=2e-5, rtol=0)
    first = slice(0, DRAFT)  # prefix 6: row 10 is not in it
    assert torch.equal(faulty[first], plain[first]) == (position >= PREFIXES[0])
    assert (faulty[DRAFT:] - plain[DRAFT:]).abs().max() > 1e-5


def test_tree_mask_fault_shows_the_root_one_more_node():
    faulty, batch, backend = run_on("tree_mask:0")
    plain, _, _ = run_on(None)
    torch.testing.assert_close(faulty, expected(batch, backend, extra_row=0), atol=2e-5, rtol=0)
    changed = (faulty - plain).abs().amax(dim=(1, 2)) > 0
    assert changed.tolist() == [i % DRAFT == 0 for i in range(len(changed))]


def test_layout_faults_refuse_cuda_graph_capture():
    _, _, backend = run_on(None)
    inputs = backend.kdtree_forward.inputs
    for phase in (Phase.CAPTURE, Phase.REPLAY):
        with pytest.raises(FaultNeedsEagerError, match="--disable-cuda-graph"):
            faulty_inputs(inputs, parse_fault("kv_drop:1"), phase)
    assert faulty_inputs(inputs, parse_fault("scale:0.1"), Phase.CAPTURE) is inputs
