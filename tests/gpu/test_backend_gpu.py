"""The backend's CUDA path on a GPU: marshaling (``VerifyMarshal``) plus the kernel call the
server makes (``verify_with_inputs``) against SGLang 0.5.23's own ``extend_attention_fwd`` on
SGLang-shaped inputs, and the same inside CUDA graphs.

``TritonAttnBackend`` itself does not import on the GPU test machine, so the metadata is laid out
here exactly as its target-verify paths lay it out: ``kv_indptr`` int32, ``qo_indptr`` int32
(eager) or int64 (graph buffers), ``kv_indices`` int64 in a buffer longer than the prefix (the
graph buffer is sized for the maximum context), the mask as SGLang's uint8 verify-mask buffer
(graph) or the draft's bool mask (eager), ``mask_indptr`` int64, ``max_extend_len`` = N.
Skipped without CUDA (tests/gpu/conftest.py).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from kdtree_inference.sglang.comparison import ComparisonRecorder, ShadowGate
from kdtree_inference.sglang.dispatch import verify_with_inputs
from kdtree_inference.sglang.extension import kernel_status
from kdtree_inference.sglang.marshal import VerifyMarshal
from kdtree_verify import verify_attention_reference
from kdtree_verify.testing import make_case, sglang_extend_attention

DEVICE = torch.device("cuda")
DTYPE = torch.bfloat16


def sglang_metadata(case, *, graph_layout: bool, index_slack: int = 4096) -> SimpleNamespace:
    """The Triton backend's ForwardMetadata fields for this case, in eager or graph layout."""
    batch = len(case.prefix_lens)
    kv_indices = torch.zeros(
        case.kv_indices.shape[0] + index_slack, dtype=torch.int64, device=DEVICE
    )
    kv_indices[: case.kv_indices.shape[0]] = case.kv_indices
    mask = case.custom_mask
    if mask is not None and graph_layout:
        buffer = torch.zeros(mask.shape[0] + 999, dtype=torch.uint8, device=DEVICE)
        buffer[: mask.shape[0]] = mask.to(torch.uint8)
        mask = buffer
    return SimpleNamespace(
        qo_indptr=case.qo_indptr.to(torch.int64 if graph_layout else torch.int32),
        kv_indptr=case.kv_indptr.to(torch.int32),
        kv_indices=kv_indices,
        custom_mask=mask,
        mask_indptr=None if case.mask_indptr is None else case.mask_indptr[: batch + 1],
        max_extend_len=case.num_draft,
    )


def assert_close_to_triton(out, case):
    """At least as close to the float32 truth as SGLang's Triton kernel (plus bf16 slack)."""
    triton = sglang_extend_attention(*case.args(), max_draft_tokens=case.num_draft)
    truth = verify_attention_reference(*case.args()).float()
    kernel_error = (out.float() - truth).abs().max().item()
    triton_error = (triton.float() - truth).abs().max().item()
    assert out.shape == triton.shape and out.dtype == triton.dtype
    assert kernel_error <= 1.5 * triton_error + 1e-2, (kernel_error, triton_error)
    torch.testing.assert_close(out.float(), triton.float(), atol=3e-2, rtol=3e-2)


def test_kernel_is_usable_here():
    status = kernel_status(DEVICE)
    assert status.usable, status.detail


def ragged(batch: int, longest: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    lens = [rng.choice([0, 1, rng.randint(2, longest)]) for _ in range(batch)]
    lens[rng.randrange(batch)] = longest
    return lens


CASES = [
    # (prefix lengths, draft tokens, heads, mask)
    ([131072], 8, 16, "tree"),
    ([32768], 8, 8, "chain"),
    ([131072, 0, 1, 77777], 4, 16, "causal"),
    (ragged(48, 4096, seed=1), 8, 16, "tree"),
    (ragged(48, 2048, seed=2), 16, 128, "tree"),
    (ragged(16, 8192, seed=3), 1, 64, "chain"),
    ([5, 300, 2049], 64, 8, "tree"),
    ([1000], 12, 12, "tree"),
    ([7, 0], 32, 32, "causal"),
]


@pytest.mark.parametrize("graph_layout", [False, True], ids=["eager", "graph-buffers"])
@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "mask"),
    CASES,
    ids=[f"B{len(c[0])}-max{max(c[0])}-T{c[1]}-H{c[2]}-{c[3]}" for c in CASES],
)
def test_marshal_and_kernel_match_sglang(prefix_lens, num_draft, num_heads, mask, graph_layout):
    case = make_case(
        prefix_lens,
        num_draft,
        num_heads,
        mask=mask,
        dtype=DTYPE,
        device=DEVICE,
        seed=len(prefix_lens),
    )
    marshal = VerifyMarshal(DEVICE, num_heads, DTYPE)
    inputs = marshal.build(sglang_metadata(case, graph_layout=graph_layout))
    assert inputs.plan is not None and inputs.total_tokens == case.q.shape[0]
    out = verify_with_inputs(
        inputs, case.q, case.k_extend, case.v_extend, case.k_buffer, case.v_buffer, case.sm_scale
    )
    assert_close_to_triton(out, case)


class StaticVerify:
    """SGLang's capture buffers for one graph batch size, refilled per replay."""

    def __init__(self, batch: int, num_draft: int, num_heads: int, max_prefix: int, pool: int):
        self.batch, self.num_draft, self.num_heads = batch, num_draft, num_heads
        tokens = batch * num_draft
        self.qo_indptr = torch.zeros(batch + 1, dtype=torch.int64, device=DEVICE)
        self.kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE)
        self.kv_indices = torch.zeros(batch * max_prefix, dtype=torch.int64, device=DEVICE)
        self.mask = torch.zeros(
            batch * num_draft * (max_prefix + num_draft), dtype=torch.uint8, device=DEVICE
        )
        self.mask_indptr = torch.zeros(batch + 1, dtype=torch.int64, device=DEVICE)
        self.k_buffer = torch.zeros(pool, 1, 576, dtype=DTYPE, device=DEVICE)
        self.q = torch.zeros(tokens, num_heads, 576, dtype=DTYPE, device=DEVICE)
        self.k_extend = torch.zeros(tokens, 1, 576, dtype=DTYPE, device=DEVICE)
        self.metadata = SimpleNamespace(
            qo_indptr=self.qo_indptr,
            kv_indptr=self.kv_indptr,
            kv_indices=self.kv_indices,
            custom_mask=self.mask,
            mask_indptr=self.mask_indptr,
            max_extend_len=num_draft,
        )

    def load(self, case) -> None:
        """What init_forward_metadata_out_graph and the model do before a replay."""
        self.qo_indptr.copy_(case.qo_indptr)
        self.kv_indptr.copy_(case.kv_indptr)
        self.kv_indices[: case.kv_indices.shape[0]].copy_(case.kv_indices)
        self.mask[: case.custom_mask.shape[0]].copy_(case.custom_mask.to(torch.uint8))
        self.mask_indptr.copy_(case.mask_indptr)
        self.k_buffer[: case.k_buffer.shape[0]].copy_(case.k_buffer)
        self.q.copy_(case.q)
        self.k_extend.copy_(case.k_extend)

    def attend(self, inputs):
        return verify_with_inputs(
            inputs,
            self.q,
            self.k_extend,
            self.k_extend[..., :512],
            self.k_buffer,
            self.k_buffer[..., :512],
            0.1352,
        )


def graph_cases(batch, num_draft, num_heads, max_prefix):
    return [
        make_case(
            ragged(batch, max_prefix, seed),
            num_draft,
            num_heads,
            mask="tree",
            dtype=DTYPE,
            device=DEVICE,
            seed=seed,
            pool_slack=0,
            sm_scale=0.1352,
            mask_dtype=torch.uint8,
        )
        for seed in (11, 12, 13)
    ]


@pytest.mark.parametrize(
    "plan_in_graph", [False, True], ids=["plan-before-replay", "plan-in-graph"]
)
def test_marshal_and_kernel_capture_and_replay(plan_in_graph):
    batch, num_draft, num_heads, max_prefix = 8, 8, 16, 4096
    cases = graph_cases(batch, num_draft, num_heads, max_prefix)
    pool = max(c.k_buffer.shape[0] for c in cases)
    static = StaticVerify(batch, num_draft, num_heads, max_prefix, pool)
    marshal = VerifyMarshal(DEVICE, num_heads, DTYPE)
    static.load(cases[0])
    # Outside capture, as init_forward_metadata_out_graph(in_capture=True): allocates the plan.
    inputs = marshal.build(static.metadata, for_graph=True)

    def step():
        if plan_in_graph:
            marshal.refresh(
                batch, batch * num_draft, static.qo_indptr, static.kv_indptr, static.mask_indptr
            )
        return static.attend(inputs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for case in cases:
        static.load(case)
        if not plan_in_graph:  # the backend re-plans in init_forward_metadata_out_graph
            marshal.refresh(
                batch, batch * num_draft, static.qo_indptr, static.kv_indptr, static.mask_indptr
            )
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_triton(out.clone(), case)


def test_comparison_and_shadow_gate_replay_in_a_graph():
    """The validate/shadow bookkeeping records on replay, only when the gate is open."""
    batch, num_draft, num_heads = 4, 8, 16
    recorder = ComparisonRecorder(1, 0, DEVICE, atol=0.02, rtol=0.02, value_dim=512)
    gate = ShadowGate(batch, DEVICE)
    kernel_out = torch.zeros(batch * num_draft, num_heads, 512, dtype=DTYPE, device=DEVICE)
    triton_out = torch.zeros_like(kernel_out)
    qo = torch.arange(batch + 1, device=DEVICE) * num_draft
    graph = torch.cuda.CUDAGraph()
    gate.set(False, qo, qo)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        recorder.record(0, kernel_out, triton_out, gate=gate.open)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        recorder.record(0, kernel_out, triton_out, gate=gate.open)
    recorder.snapshot()
    torch.cuda.synchronize()
    recorder.collect()  # drop warm-up/capture state
    kernel_out.fill_(1.0)
    for open_gate in (True, False, True):
        gate.set(open_gate, qo, qo)
        graph.replay()
    recorder.snapshot()
    torch.cuda.synchronize()
    (stats,) = recorder.collect()
    assert stats.compared == 2 * kernel_out.numel()
    assert stats.max_abs == 1.0 and stats.over_tolerance == 2 * kernel_out.numel()


def test_value_scale_refreshed_outside_a_graph_reaches_its_replays():
    """The per-dimension floor under a graph: the captured ``record`` reads the scale the
    refresh writes in place between replays, and the step's new values it was captured with."""
    tokens, num_heads = 8, 16
    recorder = ComparisonRecorder(1, 0, DEVICE, atol=0.02, rtol=0.02, value_dim=512)
    triton_out = torch.full((tokens, num_heads * 512), 0.25, dtype=DTYPE, device=DEVICE)
    kernel_out = triton_out + 0.03125  # over the plain floor 0.02 + 0.02 * 0.25
    new_values = torch.zeros(tokens, 1, 512, dtype=DTYPE, device=DEVICE)
    gate = torch.ones((), dtype=torch.bool, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        recorder.record(0, kernel_out, triton_out, gate=gate, new_values=new_values)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorder.record(0, kernel_out, triton_out, gate=gate, new_values=new_values)
    recorder.snapshot()
    torch.cuda.synchronize()
    recorder.collect()  # drop warm-up/capture state

    def over_after_replay() -> int:
        graph.replay()
        recorder.snapshot()
        torch.cuda.synchronize()
        (stats,) = recorder.collect()
        return stats.over_tolerance

    elements = kernel_out.numel()
    assert over_after_replay() == elements  # never refreshed: the plain atol
    pool = torch.zeros(4096, 1, 576, dtype=torch.float8_e4m3fn, device=DEVICE)
    pool[1000, 0, :256] = 3.0  # times v_scale 2: 6 in the first 256 latent dimensions
    recorder.refresh_value_scale(0, pool[..., :512], v_scale=2.0)
    assert over_after_replay() == elements // 2
    new_values[3, 0, 256:] = -8.0  # the step's new rows widen the other half
    assert over_after_replay() == 0


def test_eager_plans_are_bounded_and_graph_plans_kept():
    marshal = VerifyMarshal(DEVICE, 16, DTYPE, eager_plans=2)

    def metadata(batch: int):
        case = make_case([3] * batch, 4, 16, dtype=DTYPE, device=DEVICE)
        return sglang_metadata(case, graph_layout=True)

    captured = marshal.build(metadata(2), for_graph=True)
    for batch in (1, 3, 4):
        assert marshal.build(metadata(batch)).plan is not None
    assert list(marshal._eager_plans) == [(3, 12), (4, 16)]  # (1, 4) was evicted
    # An eager forward of a captured shape shares the graph's plan (refreshed before replays).
    assert marshal.build(metadata(2)).plan is captured.plan
