"""The backend's CUDA path with an fp8 (float8_e4m3fn) KV pool: marshaling plus the kernel call
the server makes (``verify_with_inputs`` with the layer's scales), in SGLang's eager and graph
metadata layouts, against the float32 reference on the dequantized pool and against SGLang's own
Triton fp8 path (``extend_attention_fwd`` with the same descales). The pool is built as
``MLATokenToKVPool`` holds it (a float8 view whose V is the first 512 columns of K's rows), q is
e4m3-exact (SGLang's Triton fp8 path rounds q to e4m3). Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from test_backend_gpu import sglang_metadata

from kdtree_inference.sglang.dispatch import verify_with_inputs
from kdtree_inference.sglang.marshal import VerifyMarshal
from kdtree_verify import verify_attention_reference
from kdtree_verify.testing import assert_close_bf16, make_case, sglang_extend_attention

DEVICE = torch.device("cuda")
FP8 = torch.float8_e4m3fn
SCALES = {"k_scale": 0.6, "v_scale": 1.4}
TRITON_FP8_BOUND = 0.1  # relative Frobenius distance (Triton's e4m3 P; see test_kernel.py)

CASES = [
    ([32768], 8, 8, "chain"),
    ([4096] * 8, 8, 8, "tree"),
    ([131072, 0, 1, 7777], 4, 16, "causal"),
    ([5, 300, 2049], 64, 8, "tree"),
]


@pytest.mark.parametrize("graph_layout", [False, True], ids=["eager", "graph-buffers"])
@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "mask"),
    CASES,
    ids=[f"B{len(c[0])}-max{max(c[0])}-T{c[1]}-H{c[2]}-{c[3]}" for c in CASES],
)
def test_fp8_marshal_and_kernel_match(prefix_lens, num_draft, num_heads, mask, graph_layout):
    case = make_case(
        prefix_lens,
        num_draft,
        num_heads,
        mask=mask,
        dtype=torch.bfloat16,
        device=DEVICE,
        seed=len(prefix_lens),
        kv_dtype=FP8,
        fp8_exact_q=True,
        **SCALES,
    )
    marshal = VerifyMarshal(DEVICE, num_heads, FP8)  # the backend passes the pool's dtype
    inputs = marshal.build(sglang_metadata(case, graph_layout=graph_layout))
    out = verify_with_inputs(
        inputs,
        case.q,
        case.k_extend,
        case.v_extend,
        case.k_buffer,
        case.v_buffer,
        case.sm_scale,
        **SCALES,
    )
    truth = verify_attention_reference(*case.args(), **SCALES)
    assert_close_bf16(out, truth, f"fp8 backend path {prefix_lens[:3]}")
    if sum(prefix_lens) <= 40000:  # SGLang's extend walks the prefix serially: keep it short
        triton = sglang_extend_attention(*case.args(), max_draft_tokens=num_draft, **SCALES)
        distance = float((out.float() - triton.float()).norm() / triton.float().norm())
        assert distance <= TRITON_FP8_BOUND, distance
