"""The backend with an fp8 KV pool (``--kv-cache-dtype fp8_e4m3``) on CPU, against SGLang's own
Triton fp8 path (interpreted, tests/conftest.py sets TRITON_INTERPRET=1): every mode serves fp8
layers with the kernel's op instead of falling back, writes the pool as the parent does, and the
op agrees with the reference on the dequantized pool and, within Triton's own e4m3 rounding of
P, with Triton.

SGLang's Triton fp8 path rounds q and P to e4m3 (``q.to(k.dtype)``, ``p.to(v.dtype)``); q is made
e4m3-exact here so that only the P rounding (<= 2^-4 relative per weight) separates the two.
"""

from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip(
        "SGLang's Triton kernels run interpreted only on a CPU machine (tests/gpu covers CUDA)",
        allow_module_level=True,
    )

from prometheus_client import CollectorRegistry
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

from kdtree_inference.sglang import testing
from kdtree_inference.sglang.backend import KdtreeTritonAttnBackend
from kdtree_inference.sglang.modes import FP8_POOL_ATOL, VerifyMode, VerifySettings
from kdtree_verify import (
    QK_DIM,
    V_DIM,
    VerifyMetadata,
    verify_attention,
    verify_attention_reference,
)

FP8 = torch.float8_e4m3fn
HEADS, DRAFT, PREFIXES = 2, 3, [5, 17]
K_SCALE, V_SCALE = 0.5, 2.0
TRITON_P_BOUND = 0.1
"""Relative Frobenius distance allowed to Triton (its e4m3 P: ~3% measured here)."""


@pytest.fixture(autouse=True)
def _sglang_context():
    with testing.sglang_cpu_context():
        yield


def scaled_layer(k_scale: float = K_SCALE, v_scale: float = V_SCALE):
    return testing.make_layer(
        0,
        HEADS,
        k_scale=torch.tensor(k_scale),
        v_scale=torch.tensor(v_scale),
        k_scale_float=k_scale,
        v_scale_float=v_scale,
    )


def run(backend_cls, layer, **kwargs):
    """One verify layer call of a fresh backend over an fp8 pool: (output, backend, batch)."""
    runner = testing.make_model_runner(num_heads=HEADS, num_draft=DRAFT, kv_dtype=FP8)
    backend = testing.make_backend(backend_cls, runner, **kwargs)
    batch = testing.make_verify_batch(runner, PREFIXES, DRAFT, HEADS, [0], dtype=torch.float32)
    q, k, v = batch.qkv[0]
    batch.qkv[0] = (q.to(FP8).float(), k, v)
    backend.init_forward_metadata(batch.forward_batch)
    return backend.forward_extend(*batch.qkv[0], layer, batch.forward_batch), backend, batch


def ours(mode: VerifyMode, layer):
    registry = CollectorRegistry()
    out, backend, batch = run(
        KdtreeTritonAttnBackend,
        layer,
        kdtree_settings=VerifySettings(mode=mode),
        kdtree_registry=registry,
    )
    return out, backend, batch, registry


def kernel_calls(registry) -> float:
    return registry.get_sample_value("kdtree_verify_kernel_calls_total", {"tp_rank": "0"}) or 0


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def pool_bytes(backend) -> torch.Tensor:
    return backend.token_to_kv_pool.get_key_buffer(0).view(torch.uint8)


def layer_args(backend, q, k, v, layer) -> tuple:
    """The backend's forward metadata and pool with one layer's q and draft KV, as the
    positional arguments of ``verify_attention`` / ``verify_attention_reference``."""
    meta = backend.forward_metadata
    pool = backend.token_to_kv_pool
    metadata = VerifyMetadata.build(
        meta.qo_indptr,
        meta.kv_indptr,
        meta.kv_indices[: int(meta.kv_indptr[-1])],
        meta.custom_mask,
        meta.mask_indptr,
        layer.scaling,
    )
    return (
        metadata,
        q.view(-1, HEADS, QK_DIM),
        k.view(-1, 1, QK_DIM),
        v.reshape(-1, 1, V_DIM),
        pool.get_key_buffer(0),
        pool.get_value_buffer(0),
    )


def reference_of(backend, batch, q, k, v, layer) -> torch.Tensor:
    """The float32 reference on the pool's dequantized prefix and the bf16-path draft KV."""
    args = layer_args(backend, q, k, v, layer)
    out = verify_attention_reference(*args, k_scale=K_SCALE, v_scale=V_SCALE)
    return out.view(q.shape[0], -1)


def op_of(backend, batch, q, k, v, layer, fp8_numerics: str) -> torch.Tensor:
    """The op itself on the backend's pool and metadata, rounding per ``fp8_numerics``."""
    args = layer_args(backend, q, k, v, layer)
    out = verify_attention(*args, k_scale=K_SCALE, v_scale=V_SCALE, fp8_numerics=fp8_numerics)
    return out.view(q.shape[0], -1)


@pytest.mark.parametrize("fp8_numerics", ["triton", "fp16"])
def test_on_mode_serves_fp8_layers_with_the_kernel_and_writes_the_pool_as_triton(fp8_numerics):
    """The default (KDTREE_FP8_NUMERICS=triton) serves the op with SGLang's roundings; fp16 serves
    the op that is the float32 reference on the dequantized pool here."""
    layer = scaled_layer()
    stock, stock_backend, _ = run(TritonAttnBackend, layer)
    settings = VerifySettings(mode=VerifyMode.ON, fp8_numerics=fp8_numerics)
    registry = CollectorRegistry()
    served, backend, batch = run(
        KdtreeTritonAttnBackend, layer, kdtree_settings=settings, kdtree_registry=registry
    )
    assert kernel_calls(registry) == 1
    assert torch.equal(pool_bytes(backend), pool_bytes(stock_backend))  # K / k_scale, in e4m3
    expected = op_of(backend, batch, *batch.qkv[0], layer, fp8_numerics)
    torch.testing.assert_close(served, expected, atol=2e-5, rtol=1e-5)
    if fp8_numerics == "fp16":
        reference = reference_of(backend, batch, *batch.qkv[0], layer)
        torch.testing.assert_close(served, reference, atol=2e-5, rtol=1e-5)
    else:  # P rounded to e4m3: not the reference any more
        assert relative(served, reference_of(backend, batch, *batch.qkv[0], layer)) > 1e-3
    assert relative(served, stock) < TRITON_P_BOUND


def test_the_default_fp8_numerics_are_tritons():
    assert VerifySettings().fp8_numerics == "triton"
    assert VerifySettings.from_env({"KDTREE_FP8_NUMERICS": "FP16"}).fp8_numerics == "fp16"


def test_triton_bound_rejects_misplaced_scales():
    """The distance bound to Triton is a test: with k_scale and v_scale swapped it fails."""
    stock, _, _ = run(TritonAttnBackend, scaled_layer())
    swapped, _, _, _ = ours(VerifyMode.ON, scaled_layer(V_SCALE, K_SCALE))
    assert relative(swapped, stock) > 3 * TRITON_P_BOUND


def test_validate_mode_serves_triton_and_compares_the_kernel():
    layer = scaled_layer()
    stock, _, _ = run(TritonAttnBackend, layer)
    served, backend, _, registry = ours(VerifyMode.VALIDATE, layer)
    assert torch.equal(served, stock)
    assert kernel_calls(registry) == 1
    backend.kdtree_recorder.snapshot()
    (stats,) = backend.kdtree_recorder.collect()
    assert stats.compared == len(PREFIXES) * DRAFT * HEADS * 512
    assert 0 < stats.max_abs < 1.0  # Triton's e4m3 P against the kernel's bf16-or-better P
    fallbacks = registry.get_sample_value(
        "kdtree_verify_fallbacks_total", {"tp_rank": "0", "reason": "fp8_kv"}
    )
    assert not fallbacks


def test_validate_over_an_fp8_pool_takes_the_fp8_tolerance():
    _, backend, _, _ = ours(VerifyMode.VALIDATE, scaled_layer())
    assert backend.kdtree_settings.atol == FP8_POOL_ATOL
    assert backend.kdtree_recorder.atol == FP8_POOL_ATOL
    assert all(r.atol == FP8_POOL_ATOL for r in backend.kdtree_exact_recorders.values())


def test_off_mode_is_stock_with_an_fp8_pool():
    layer = scaled_layer()
    stock, stock_backend, _ = run(TritonAttnBackend, layer)
    served, backend, _, registry = ours(VerifyMode.OFF, layer)
    assert torch.equal(served, stock)
    assert torch.equal(pool_bytes(backend), pool_bytes(stock_backend))
    assert kernel_calls(registry) == 0


def test_unscaled_fp8_layer_is_served_like_triton():
    """No checkpoint scales (layer.k_scale is None): the pool holds K cast to e4m3 and both sides
    use unit descales."""
    layer = testing.make_layer(0, HEADS)
    stock, _, _ = run(TritonAttnBackend, layer)
    served, _, _, registry = ours(VerifyMode.ON, layer)
    assert kernel_calls(registry) == 1
    assert relative(served, stock) < TRITON_P_BOUND


def test_validate_reports_each_sides_error_against_the_exact_computation():
    """Validate with an fp8 pool also measures Triton's and the kernel's distance to the exact
    computation on the stored values (the op's fp16-operand mode, here float32): the published
    gauges are those distances, each computed again here from the three outputs."""
    layer = scaled_layer()
    served, backend, batch, registry = ours(VerifyMode.VALIDATE, layer)
    q, k, v = batch.qkv[0]
    exact = op_of(backend, batch, q, k, v, layer, "fp16")
    kernel = op_of(backend, batch, q, k, v, layer, "triton")
    backend.kdtree_flush()

    def gauge(side: str) -> float | None:
        return registry.get_sample_value(
            "kdtree_verify_max_abs_error_vs_exact", {"side": side, "layer": "0", "tp_rank": "0"}
        )

    assert gauge("triton") == pytest.approx(float((served - exact).abs().max()), rel=1e-6)
    assert gauge("kdtree") == pytest.approx(float((kernel - exact).abs().max()), rel=1e-6)
    assert gauge("triton") > 0 and gauge("kdtree") > 0


def test_on_mode_keeps_no_exact_comparison():
    _, backend, _, registry = ours(VerifyMode.ON, scaled_layer())
    assert backend.kdtree_exact_recorders == {}
    backend.kdtree_flush()
    assert (
        registry.get_sample_value(
            "kdtree_verify_max_abs_error_vs_exact", {"side": "triton", "layer": "0", "tp_rank": "0"}
        )
        is None
    )
