"""The CUDA kernel on a GPU: the sweep against the float32 reference, SGLang's Triton
``extend_attention_fwd`` and the CPU op (the numerics specification); input variants; refusals;
CUDA-graph capture and replay with new metadata.

Tolerance (bf16 output). bf16 keeps 8 significant bits, so one rounding errs by at most 2^-9
relative. Our result is rounded twice (P to bf16 before the P*V MMA, the output to bf16) and the
reference once (its float32 output to bf16), hence an elementwise bound of 2^-7 relative, plus an
absolute 2^-8 x max|ref| of the case for entries near zero, which are sums of terms of the size of
max|ref| (cancellation makes their relative error meaningless). The LSE is float32 throughout and
must agree to 2e-3 absolute (ex2.approx and a different summation order).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdtree_verify import (
    VerifyInputError,
    VerifyMetadata,
    verify_attention,
    verify_attention_reference,
)
from kdtree_verify.cuda import verify_attention_cuda
from kdtree_verify.plan import VerifyPlan, make_plan, split_chunk
from kdtree_verify.testing import (
    VerifyCase,
    assert_close_bf16,
    assert_lse_close,
    assert_matches_reference,
    boost_prefix_keys,
    make_case,
)

pytestmark = pytest.mark.gpu

PREFIXES = (0, 1, 63, 64, 65, 1000, 4097, 32768, 131072)
DRAFTS = (1, 2, 5, 8, 13, 16, 32, 64)
HEADS = (8, 12, 16, 128)
BATCHES = (1, 3, 8, 48)
MASKS = ("tree", "chain", "causal")


def _sweep() -> list[tuple[tuple[int, ...], int, int, str]]:
    """(prefix_lens, T, H, mask): every value of every axis, mixed, ragged for B > 1.

    Case i takes PREFIXES[i % 9], DRAFTS[i % 8], HEADS[(i // 2) % 4], BATCHES[(i // 3) % 4] and
    MASKS[i % 3]. Request 0 gets the sweep prefix; the others get a ragged mix of small prefixes
    (0 and 1 included) so B x prefix stays within memory and the reference stays fast.
    """
    cases = []
    for i in range(36):
        prefix = PREFIXES[i % 9]
        batch = BATCHES[(i // 3) % 4]
        if prefix >= 32768 and batch > 3:
            batch = 3
        others = [(0, 1, 65, 1000, 4097, 64, 63)[(i + j) % 7] for j in range(batch - 1)]
        cases.append(((prefix, *others), DRAFTS[i % 8], HEADS[(i // 2) % 4], MASKS[i % 3]))
    return cases


SWEEP = _sweep()


def run_case(case: VerifyCase) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = verify_attention(*case.args(), return_lse=True)
    torch.cuda.synchronize()
    return out, lse


def test_sweep_covers_every_axis_value() -> None:
    assert {c[0][0] for c in SWEEP} == set(PREFIXES)
    assert {c[1] for c in SWEEP} == set(DRAFTS)
    assert {c[2] for c in SWEEP} == set(HEADS)
    assert {len(c[0]) for c in SWEEP} >= {1, 3} and any(len(c[0]) == 48 for c in SWEEP)
    assert {c[3] for c in SWEEP} == set(MASKS)


@pytest.mark.parametrize(("prefix_lens", "num_draft", "num_heads", "mask"), SWEEP)
def test_sweep_against_reference(prefix_lens, num_draft, num_heads, mask) -> None:
    case = make_case(
        prefix_lens,
        num_draft,
        num_heads,
        mask=mask,
        dtype=torch.bfloat16,
        device="cuda",
        seed=sum(prefix_lens) + num_draft,
    )
    what = f"B={len(prefix_lens)} prefix={prefix_lens[0]} T={num_draft} H={num_heads} {mask}"
    assert_matches_reference(*run_case(case), case.args(), what)


def _sglang_extend():
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # noqa: F401

        from kdtree_verify.testing import sglang_extend_attention
    except ImportError as exc:
        pytest.fail(f"SGLang's Triton kernels must import on the GPU machine: {exc}")
    return sglang_extend_attention


@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "mask"),
    [c for c in SWEEP if sum(c[0]) <= 40000],
)
def test_sweep_against_sglang_extend(prefix_lens, num_draft, num_heads, mask) -> None:
    extend = _sglang_extend()
    case = make_case(
        prefix_lens,
        num_draft,
        num_heads,
        mask=mask,
        dtype=torch.bfloat16,
        device="cuda",
        seed=7 + num_draft,
    )
    out, _ = run_case(case)
    theirs = extend(*case.args(), max_draft_tokens=num_draft)
    # Both sides are bf16 results with their own roundings: twice the one-sided bound.
    assert_close_bf16(out, theirs, f"vs SGLang extend {prefix_lens[:2]} T={num_draft}", factor=2)


@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "mask"),
    [
        ((0,), 1, 8, "tree"),
        ((65, 0, 1000), 5, 12, "chain"),
        ((300, 7), 13, 16, "causal"),
        ((64, 63), 16, 8, "tree"),
    ],
)
def test_cuda_op_matches_cpu_specification(prefix_lens, num_draft, num_heads, mask) -> None:
    gpu = make_case(
        prefix_lens, num_draft, num_heads, mask=mask, dtype=torch.bfloat16, device="cuda", seed=3
    )
    cpu = make_case(
        prefix_lens, num_draft, num_heads, mask=mask, dtype=torch.bfloat16, device="cpu", seed=3
    )
    out_gpu, lse_gpu = run_case(gpu)
    out_cpu, lse_cpu = verify_attention(*cpu.args(), return_lse=True)
    assert_close_bf16(out_gpu.cpu(), out_cpu, "CUDA vs CPU op")
    assert_lse_close(lse_gpu.cpu(), lse_cpu, "CUDA vs CPU op")


@pytest.mark.parametrize(
    "variant",
    [
        "int32_indices",
        "bool_mask",
        "separate_v",
        "fp16",
        "int32_indptr",
        "all_prefix_zero",
        "q_rows_strided",
        "q_rows_unaligned",
    ],
)
def test_input_variants(variant: str) -> None:
    kwargs = {"dtype": torch.bfloat16, "device": "cuda", "seed": 11}
    prefix_lens = (4097, 0, 65, 1)
    if variant == "int32_indices":
        kwargs["index_dtype"] = torch.int32
    elif variant == "bool_mask":
        kwargs["mask_dtype"] = torch.bool
    elif variant == "separate_v":
        kwargs["strided_v"] = False  # v_buffer / v_extend are copies, not views of K
    elif variant == "fp16":
        kwargs["dtype"] = torch.float16
    elif variant == "all_prefix_zero":
        prefix_lens = (0, 0, 0)
    case = make_case(prefix_lens, 7, 16, **kwargs)
    if variant == "int32_indptr":
        case.qo_indptr = case.qo_indptr.int()
        case.kv_indptr = case.kv_indptr.int()
        case.mask_indptr = case.mask_indptr.int()
    if variant == "separate_v":
        assert case.v_buffer.data_ptr() != case.k_buffer.data_ptr()
    if variant.startswith("q_rows"):
        # Q as a view with padded rows: 584 keeps each row 16-byte aligned (copied to shared
        # memory), 580 does not (read straight into registers).
        width = 584 if variant == "q_rows_strided" else 580
        padded = torch.full(
            (*case.q.shape[:2], width), float("nan"), dtype=case.q.dtype, device="cuda"
        )
        padded[..., :576] = case.q
        case.q = padded[..., :576]
        assert not case.q.is_contiguous()
    assert_matches_reference(*run_case(case), case.args(), variant)


@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "index_dtype"),
    [
        ((200_000,), 16, 16, torch.int64),
        ((200_000, 0, 65), 64, 16, torch.int32),
        ((204_800,), 8, 128, torch.int64),
        ((5000, 1, 0), 128, 8, torch.int64),
        ((70_000,), 100, 32, torch.int64),
    ],
    ids=["200k", "200k-ragged-T64", "200k-H128", "T128-ragged", "T100-70k"],
)
def test_beyond_the_sweep(prefix_lens, num_draft, num_heads, index_dtype) -> None:
    """Prefixes up to 200k (SGLang's range; the sweep stops at 128k) and T over 64 (a bonus in
    the issue). Splits (plan.split_chunk): 16 of 12,512 tokens at 200k; 2 of 100,032 tokens at
    200k with T=64 (the cap allows 3, one wave takes 2); 4 of 51,232 at H=128."""
    case = make_case(
        prefix_lens,
        num_draft,
        num_heads,
        dtype=torch.bfloat16,
        device="cuda",
        seed=sum(prefix_lens) + num_draft,
        index_dtype=index_dtype,
    )
    what = f"prefixes {prefix_lens} T={num_draft} H={num_heads}"
    assert_matches_reference(*run_case(case), case.args(), what)


def test_refuses_fp32_e5m2_and_a_separate_fp8_v_with_clear_errors() -> None:
    case = make_case((10,), 2, 8, dtype=torch.float32, device="cuda")
    with pytest.raises(VerifyInputError, match="bfloat16 and float16"):
        run_case(case)
    base = make_case((10,), 2, 8, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(2, 8, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 8, dtype=torch.float32, device="cuda")
    for k8, v8, message in (
        (base.k_buffer.to(torch.float8_e5m2), None, "neither"),
        (base.k_buffer.to(torch.float8_e4m3fn), "copy", "first 512 columns"),
    ):
        v8 = k8[..., :512] if v8 is None else k8[..., :512].clone()
        with pytest.raises(VerifyInputError, match=message):
            verify_attention_cuda(
                base.metadata(), base.q, base.k_extend, base.v_extend, k8, v8, out, lse
            )


def test_cuda_path_refuses_layouts_it_would_misread() -> None:
    """Strided index tensors and outputs on another device: a VerifyInputError naming the tensor
    (which the SGLang backend answers with a fallback), not the extension's RuntimeError."""
    case = make_case((300, 7), 4, 8, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(8, 8, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(8, 8, dtype=torch.float32, device="cuda")
    spaced = torch.zeros(2 * case.kv_indices.numel(), dtype=case.kv_indices.dtype, device="cuda")
    spaced[::2] = case.kv_indices
    strided = VerifyMetadata.build(
        case.qo_indptr,
        case.kv_indptr,
        spaced[::2],  # kv_indices, the same values with stride 2
        case.custom_mask,
        case.mask_indptr,
        case.sm_scale,
    )
    with pytest.raises(VerifyInputError, match="kv_indices: the CUDA kernel reads it by position"):
        verify_attention_cuda(strided, *case.layer(), out, lse)
    with pytest.raises(VerifyInputError, match="out: is on cpu but q is on cuda"):
        verify_attention_cuda(*case.args(), out.cpu(), lse)
    verify_attention_cuda(*case.args(), out, lse)  # the same call, laid out as required
    assert_matches_reference(out, lse, case.args(), "after the refusals")


def test_plan_less_calls_on_two_streams_get_their_own_workspace() -> None:
    """Without a plan the op caches one per shape; two streams may run such calls at once, so each
    stream gets its own workspace (one shared workspace would be a race between them)."""
    from kdtree_verify import cuda as cuda_op

    cases = [
        make_case((3000, 40), 8, 16, dtype=torch.bfloat16, device="cuda", seed=s) for s in (1, 2)
    ]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = []
    for case, stream in zip(cases, streams, strict=True):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            results.append(verify_attention(*case.args(), return_lse=True))
    torch.cuda.synchronize()
    handles = {stream.cuda_stream for stream in streams}
    workspaces = {
        plan.workspace.data_ptr() for key, plan in cuda_op._plan_cache.items() if key[1] in handles
    }
    assert len(workspaces) == 2
    for i, (case, (out, lse)) in enumerate(zip(cases, results, strict=True)):
        assert_matches_reference(out, lse, case.args(), f"stream {i}")


def _static_inputs(batch: int, num_draft: int, num_heads: int, max_prefix: int):
    """Static buffers sized for the captured maxima, as SGLang's graph runner keeps them."""
    total = batch * num_draft
    pool = batch * (max_prefix + num_draft) + 64
    dev = "cuda"
    return {
        "q": torch.zeros(total, num_heads, 576, dtype=torch.bfloat16, device=dev),
        "k_extend": torch.zeros(total, 1, 576, dtype=torch.bfloat16, device=dev),
        "k_buffer": torch.zeros(pool, 1, 576, dtype=torch.bfloat16, device=dev),
        "qo_indptr": torch.zeros(batch + 1, dtype=torch.int64, device=dev),
        "kv_indptr": torch.zeros(batch + 1, dtype=torch.int64, device=dev),
        "kv_indices": torch.zeros(batch * max_prefix, dtype=torch.int64, device=dev),
        "mask": torch.zeros(
            batch * num_draft * (max_prefix + num_draft), dtype=torch.uint8, device=dev
        ),
        "mask_indptr": torch.zeros(batch + 1, dtype=torch.int64, device=dev),
        "out": torch.zeros(total, num_heads, 512, dtype=torch.bfloat16, device=dev),
        "lse": torch.zeros(total, num_heads, dtype=torch.float32, device=dev),
    }


def _load_case(static: dict, case: VerifyCase) -> None:
    static["q"].copy_(case.q)
    static["k_extend"].copy_(case.k_extend)
    static["k_buffer"][: case.k_buffer.shape[0]].copy_(case.k_buffer)
    for name in ("qo_indptr", "kv_indptr", "mask_indptr"):
        static[name].copy_(getattr(case, name))
    static["kv_indices"][: case.kv_indices.shape[0]].copy_(case.kv_indices)
    static["mask"][: case.custom_mask.shape[0]].copy_(case.custom_mask)


def _static_metadata(static: dict, plan: VerifyPlan) -> VerifyMetadata:
    """The forward's metadata on the static buffers (built once; the plan is updated per step)."""
    return VerifyMetadata.build(
        static["qo_indptr"],
        static["kv_indptr"],
        static["kv_indices"],
        static["mask"],
        static["mask_indptr"],
        0.1352,
        plan=plan,
    )


def _static_layer(static: dict) -> tuple[torch.Tensor, ...]:
    """One layer's tensors on the static buffers: q, k_extend, v_extend, k_buffer, v_buffer."""
    k_extend, k_buffer = static["k_extend"], static["k_buffer"]
    return static["q"], k_extend, k_extend[..., :512], k_buffer, k_buffer[..., :512]


def test_cuda_graph_replay_with_new_metadata_equals_eager() -> None:
    batch, num_draft, num_heads, max_prefix = 4, 8, 16, 5000
    static = _static_inputs(batch, num_draft, num_heads, max_prefix)
    plan = make_plan(batch, num_heads, batch * num_draft, "cuda")
    metadata = _static_metadata(static, plan)

    def step() -> None:
        plan.update(static["qo_indptr"], static["kv_indptr"], static["mask_indptr"])
        verify_attention_cuda(metadata, *_static_layer(static), static["out"], static["lse"])

    def captured_shape_case(
        prefix_lens: tuple[int, ...], seed: int, mask: str = "tree"
    ) -> VerifyCase:
        return make_case(
            prefix_lens,
            num_draft,
            num_heads,
            mask=mask,
            dtype=torch.bfloat16,
            device="cuda",
            seed=seed,
            sm_scale=0.1352,
        )

    first = captured_shape_case((100, 5000, 0, 33), seed=1)
    _load_case(static, first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture (module load, kernel attributes)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    replays = [
        first,
        captured_shape_case((4999, 1, 64, 2048), seed=2),
        captured_shape_case((0, 0, 0, 0), seed=3),
        captured_shape_case((3000, 3000, 3000, 3000), seed=4, mask="chain"),
    ]
    for i, case in enumerate(replays):
        _load_case(static, case)
        static["out"].zero_()
        graph.replay()
        torch.cuda.synchronize()
        eager_out, eager_lse = run_case(case)
        assert torch.equal(static["out"], eager_out), f"replay {i}: graph output != eager"
        assert torch.equal(static["lse"], eager_lse), f"replay {i}: graph lse != eager"
        ref_out, _ = verify_attention_reference(*case.args(), return_lse=True)
        assert_close_bf16(static["out"], ref_out, f"replay {i} vs reference")


def assert_script_passes(name: str) -> None:
    """Run tests/gpu/``name`` in a fresh Python process: exit status 0 and ``ok`` last."""
    script = Path(__file__).with_name(name)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert done.stdout.splitlines()[-1] == "ok", report


def test_kernels_first_launched_inside_capture_replay_to_eager() -> None:
    """No eager warm-up: the kernels load, and the combine's occupancy query runs, in capture."""
    assert_script_passes("capture_cold_start.py")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device_in_one_process() -> None:
    """cuda:0, then cuda:1 with cuda:0 current: per-device kernel setup on each device."""
    assert_script_passes("two_devices.py")


@pytest.mark.parametrize("splits", ["planned", "one"])
def test_late_score_jumps_move_the_running_max(splits: str) -> None:
    """Scores jumping far above the running max in late KV tiles (by more than 2^8 in exp2 units,
    the kernel's lazy-rescale threshold) and an early spike that leaves later tiles negligible.
    With one split the jumps land inside one CTA's main loop (the rare rescale path); with the
    planned splits they also meet in the LSE merge of the combine kernel."""
    case = make_case((4097, 300), 8, 16, mask="tree", dtype=torch.bfloat16, device="cuda", seed=11)
    boost_prefix_keys(case, {5: 60.0, 1500: 80.0, 3000: 160.0, 4000: 320.0})
    plan = make_plan(
        2, 16, 16, "cuda", **({"target_ctas": 1, "max_splits": 1} if splits == "one" else {})
    )
    plan.update(case.qo_indptr, case.kv_indptr, case.mask_indptr)
    out = torch.empty(16, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(16, 16, dtype=torch.float32, device="cuda")
    verify_attention_cuda(*case.args(plan=plan), out, lse)
    torch.cuda.synchronize()
    ref_out, ref_lse = verify_attention_reference(*case.args(), return_lse=True)
    assert float(ref_lse[:8].max() - ref_lse[8:].max()) > 8  # the jumps dominate request 0
    assert_close_bf16(out, ref_out, f"score jumps, {splits} split(s)")
    assert_lse_close(lse, ref_lse, f"score jumps, {splits} split(s)")


def test_plan_refuses_a_workspace_short_of_the_formula() -> None:
    """A workspace 256 bytes short of the documented size is refused before any launch."""
    plan = make_plan(3, 16, 24, "cuda")
    assert plan.workspace.numel() == plan.layout.total_bytes
    case = make_case((10, 20, 30), 8, 16, dtype=torch.bfloat16, device="cuda")
    plan.workspace = plan.workspace[: plan.layout.total_bytes - 256]
    with pytest.raises(ValueError, match="at least"):
        plan.update(case.qo_indptr, case.kv_indptr, case.mask_indptr)


def test_ragged_draft_counts() -> None:
    """qo_indptr need not be uniform: requests with 1, 0, 9 and 3 draft tokens in one batch (the
    request without draft tokens has a prefix but no rows, hence no row tiles)."""
    parts = [
        make_case((p,), n, 12, dtype=torch.bfloat16, device="cuda", seed=s, mask="causal")
        for s, (p, n) in enumerate([(500, 1), (70, 9), (1, 3)])
    ]
    base = parts[0]
    q = torch.cat([c.q for c in parts])
    k_ext = torch.cat([c.k_extend for c in parts])
    pool = torch.cat([c.k_buffer for c in parts])
    offsets = list(itertools.accumulate([0] + [c.k_buffer.shape[0] for c in parts[:-1]]))
    kv_indices = [c.kv_indices + off for c, off in zip(parts, offsets, strict=True)]
    kv_indices.insert(1, kv_indices[0][:40])  # the draft-less request's 40 prefix tokens
    kv_indices = torch.cat(kv_indices)
    qo = torch.tensor([0, 1, 1, 10, 13], device="cuda")
    kv = torch.tensor([0, 500, 540, 610, 611], device="cuda")
    metadata = VerifyMetadata.build(qo, kv, kv_indices, None, None, base.sm_scale)
    args = (metadata, q, k_ext, k_ext[..., :512], pool, pool[..., :512])
    out, lse = verify_attention(*args, return_lse=True)
    assert_matches_reference(out, lse, args, "ragged draft counts")


@pytest.mark.parametrize(("num_draft", "num_heads"), [(2, 128), (1, 8)])
def test_batch_wider_than_the_plan_block(num_draft: int, num_heads: int) -> None:
    """600 requests: each of the plan kernel's 256 threads owns up to 3 of them, so the row-tile
    table is written in several warp-wide rounds (8 row tiles per request at H=128, T=2)."""
    prefixes = tuple((0, 1, 33, 70, 129)[i % 5] for i in range(600))
    case = make_case(
        prefixes, num_draft, num_heads, mask="tree", dtype=torch.bfloat16, device="cuda", seed=5
    )
    assert_matches_reference(*run_case(case), case.args(), f"B=600 T={num_draft} H={num_heads}")


PLAN_BATCHES = {
    "B=8 H=8 T=8 4k": ([(8, 4096)] * 8, 8),
    "B=1 H=128 T=16 128k": ([(16, 131072)], 128),
    "B=1 H=8 T=8 4k": ([(8, 4096)], 8),
    "B=32 H=128 T=16 4k": ([(16, 4096)] * 32, 128),
    "ragged": ([(5, 70000), (0, 300), (13, 1), (2, 4097), (8, 32768), (1, 0)], 16),
    "no draft tokens": ([(0, 10), (0, 0)], 8),
}


@pytest.mark.parametrize("name", list(PLAN_BATCHES))
def test_plan_splits_by_the_host_rule(name: str) -> None:
    """The plan kernel's split size equals kdtree_verify.plan.split_chunk, and its row-tile table
    gives every request ceil((L + N) / chunk) splits: one wave of CTAs wherever one fits."""
    requests, heads = PLAN_BATCHES[name]
    qo = torch.tensor([0, *itertools.accumulate(n for n, _ in requests)], device="cuda")
    kv = torch.tensor(
        [0, *itertools.accumulate(p for _, p in requests)], device="cuda", dtype=torch.int32
    )
    plan = make_plan(len(requests), heads, int(qo[-1]), "cuda")
    plan.update(qo, kv)
    ws = plan.workspace.cpu()
    chunk = int(ws[plan.layout.chunk : plan.layout.chunk + 4].view(torch.int32))
    assert chunk == split_chunk(requests, heads, plan.target_ctas, plan.max_splits)
    table = ws[plan.layout.tiles : plan.layout.tiles + 48 * plan.num_tile_slots]
    table = table.view(torch.int32).view(plan.num_tile_slots, 12)
    used = table[table[:, 8] >= 0]  # field 8: the request, -1 in an empty slot
    expected = [
        ((p + n + chunk - 1) // chunk, b)
        for b, (n, p) in enumerate(requests)
        for _ in range((n * heads + 31) // 32)
    ]
    assert sorted(zip(used[:, 7].tolist(), used[:, 8].tolist(), strict=True)) == sorted(expected)
    if len(used) <= plan.target_ctas:
        assert int(used[:, 7].sum()) <= plan.target_ctas


# ---------------------------------------------------------------------------------------------
# fp8 (float8_e4m3fn) KV pool: K / k_scale rounded to e4m3 as SGLang stores it, V its first 512
# columns, the draft tokens' KV in bf16. The kernel dequantizes exactly (e4m3 values are bf16
# values), takes k_scale on the prefix scores and v_scale on the prefix P, so it is held to the
# bf16 bound against the float32 reference on the dequantized values. Scales differ from 1 and
# from each other so that a dropped or swapped scale fails.
FP8 = torch.float8_e4m3fn
FP8_SCALES = {"k_scale": 0.75, "v_scale": 1.25}


def fp8_case(prefix_lens, num_draft, num_heads, **kwargs) -> VerifyCase:
    kwargs = {"dtype": torch.bfloat16, "device": "cuda", **FP8_SCALES, **kwargs}
    return make_case(prefix_lens, num_draft, num_heads, kv_dtype=FP8, **kwargs)


def run_fp8(case: VerifyCase) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = verify_attention(*case.args(), return_lse=True, **case.scales())
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.parametrize(("prefix_lens", "num_draft", "num_heads", "mask"), SWEEP)
def test_fp8_sweep_against_reference(prefix_lens, num_draft, num_heads, mask) -> None:
    case = fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=sum(prefix_lens) + 3)
    what = f"fp8 B={len(prefix_lens)} prefix={prefix_lens[0]} T={num_draft} H={num_heads} {mask}"
    assert_matches_reference(*run_fp8(case), case.args(), what, **case.scales())


@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "extra"),
    [
        ((200_000,), 16, 16, {}),
        ((200_000, 0, 65), 64, 16, {"index_dtype": torch.int32}),
        ((4097, 0, 65, 1), 7, 16, {"dtype": torch.float16}),
        ((4097, 0, 65, 1), 7, 16, {"strided_v": False}),  # a separate bf16 v_extend
        ((70_000,), 100, 32, {"mask": "chain"}),
        ((0, 0, 0), 5, 8, {"mask": "causal"}),
    ],
    ids=["200k", "200k-ragged-T64-int32", "fp16-q", "separate-v-extend", "T100-70k", "no-prefix"],
)
def test_fp8_variants(prefix_lens, num_draft, num_heads, extra) -> None:
    case = fp8_case(prefix_lens, num_draft, num_heads, seed=21, **extra)
    what = f"fp8 {prefix_lens} T={num_draft} H={num_heads} {extra}"
    assert_matches_reference(*run_fp8(case), case.args(), what, **case.scales())


def test_fp8_scales_are_the_ones_applied() -> None:
    """The same pool with the scales swapped gives another answer, far outside the bound."""
    case = fp8_case((3000, 40), 8, 16, seed=4)
    out, _ = run_fp8(case)
    swapped = verify_attention(*case.args(), k_scale=1.25, v_scale=0.75)
    ref = verify_attention_reference(*case.args(), **case.scales())
    assert_close_bf16(out, ref, "fp8 scales")
    assert float((swapped.float() - ref.float()).abs().max()) > 8 * 2**-7 * float(ref.abs().max())


@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "mask"),
    [((0,), 1, 8, "tree"), ((65, 0, 1000), 5, 12, "chain"), ((300, 7), 13, 16, "causal")],
)
def test_fp8_cuda_op_matches_cpu_specification(prefix_lens, num_draft, num_heads, mask) -> None:
    gpu = fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=3)
    cpu = fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=3, device="cpu")
    out_gpu, lse_gpu = run_fp8(gpu)
    out_cpu, lse_cpu = verify_attention(*cpu.args(), return_lse=True, **cpu.scales())
    assert_close_bf16(out_gpu.cpu(), out_cpu, "fp8 CUDA vs CPU op")
    assert_lse_close(lse_gpu.cpu(), lse_cpu, "fp8 CUDA vs CPU op")


@pytest.mark.parametrize("splits", ["planned", "one"])
def test_fp8_late_score_jumps_move_the_running_max(splits: str) -> None:
    case = fp8_case((4097, 300), 8, 16, mask="tree", seed=11)
    boost_prefix_keys(case, {5: 60.0, 1500: 80.0, 3000: 160.0, 4000: 320.0})
    plan = make_plan(
        2, 16, 16, "cuda", **({"target_ctas": 1, "max_splits": 1} if splits == "one" else {})
    )
    plan.update(case.qo_indptr, case.kv_indptr, case.mask_indptr)
    out = torch.empty(16, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(16, 16, dtype=torch.float32, device="cuda")
    verify_attention_cuda(*case.args(plan=plan), out, lse, **case.scales())
    torch.cuda.synchronize()
    assert_matches_reference(out, lse, case.args(), f"fp8 score jumps, {splits}", **case.scales())


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


TRITON_FP8_BOUND = 0.1
"""Relative Frobenius distance to SGLang's Triton fp8 path, which rounds P to e4m3 (<= 2^-4 per
weight; q is made e4m3-exact, so its rounding of q costs nothing)."""


@pytest.mark.parametrize(
    ("prefix_lens", "num_draft", "num_heads", "mask"),
    [c for c in SWEEP if sum(c[0]) <= 40000][::2],
)
def test_fp8_against_sglang_triton_fp8(prefix_lens, num_draft, num_heads, mask) -> None:
    """SGLang's own extend_attention_fwd with the fp8 pool and the same k/v descales: the kernel
    is within TRITON_FP8_BOUND of it, and the bound rejects the kernel run with swapped scales."""
    extend = _sglang_extend()
    case = fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=9, fp8_exact_q=True)
    out, _ = run_fp8(case)
    theirs = extend(*case.args(), max_draft_tokens=num_draft, **case.scales())
    torch.cuda.synchronize()
    assert torch.isfinite(theirs).all()
    what = f"fp8 vs SGLang Triton fp8 {prefix_lens[:2]} T={num_draft} H={num_heads} {mask}"
    distance = relative_distance(out, theirs)
    exact = relative_distance(verify_attention_reference(*case.args(), **case.scales()), theirs)
    assert distance <= TRITON_FP8_BOUND, (
        f"{what}: relative distance {distance:.3g} (the float32 reference's: {exact:.3g})"
    )
    if prefix_lens[0] >= 64:  # a prefix that dominates: swapped scales must show
        swapped = verify_attention(*case.args(), k_scale=1.25, v_scale=0.75)
        assert relative_distance(swapped, theirs) > TRITON_FP8_BOUND, f"{what}: bound too loose"


def test_fp8_cuda_graph_replay_with_new_metadata_equals_eager() -> None:
    batch, num_draft, num_heads, max_prefix = 4, 8, 16, 5000
    static = _static_inputs(batch, num_draft, num_heads, max_prefix)
    static["k_buffer"] = static["k_buffer"].to(FP8)
    plan = make_plan(batch, num_heads, batch * num_draft, "cuda")
    metadata = _static_metadata(static, plan)

    def step() -> None:
        plan.update(static["qo_indptr"], static["kv_indptr"], static["mask_indptr"])
        verify_attention_cuda(
            metadata, *_static_layer(static), static["out"], static["lse"], **FP8_SCALES
        )

    def captured_shape_case(prefix_lens, seed, mask="tree") -> VerifyCase:
        return fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=seed, sm_scale=0.1352)

    first = captured_shape_case((100, 5000, 0, 33), seed=1)
    _load_case(static, first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for i, case in enumerate(
        [
            first,
            captured_shape_case((4999, 1, 64, 2048), seed=2),
            captured_shape_case((0, 0, 0, 0), seed=3),
            captured_shape_case((3000, 3000, 3000, 3000), seed=4, mask="chain"),
        ]
    ):
        _load_case(static, case)
        static["out"].zero_()
        graph.replay()
        torch.cuda.synchronize()
        eager_out, eager_lse = run_fp8(case)
        assert torch.equal(static["out"], eager_out), f"fp8 replay {i}: graph output != eager"
        assert torch.equal(static["lse"], eager_lse), f"fp8 replay {i}: graph lse != eager"
        ref_out = verify_attention_reference(*case.args(), **case.scales())
        assert_close_bf16(static["out"], ref_out, f"fp8 replay {i} vs reference")


# fp8 pool with fp8_numerics="triton": the roundings of SGLang's Triton fp8 path (q and the
# prefix's P to e4m3, the draft's P to q's dtype, P against the running max of every earlier
# token). The CPU specification computes that sequentially; the kernel splits the prefix and
# starts each split from the maxima of the earlier ones, so the two agree to within the bf16
# bound, and the kernel is far closer to SGLang's Triton path than the fp16 mode is.
TRITON_CASES = [
    ((32768,), 8, 16, "tree"),
    ((5000, 0, 1000, 17), 16, 8, "causal"),
    ((70_000,), 8, 8, "chain"),
    ((4097, 65, 1), 7, 16, "tree"),
]


def run_fp8_triton(case: VerifyCase) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = verify_attention(
        *case.args(), return_lse=True, fp8_numerics="triton", **case.scales()
    )
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.parametrize(("prefix_lens", "num_draft", "num_heads", "mask"), TRITON_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_triton_numerics_match_cpu_specification(
    prefix_lens, num_draft, num_heads, mask, dtype
) -> None:
    gpu = fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=5, dtype=dtype)
    cpu = fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=5, dtype=dtype, device="cpu")
    out_gpu, lse_gpu = run_fp8_triton(gpu)
    out_cpu, lse_cpu = verify_attention(
        *cpu.args(), return_lse=True, fp8_numerics="triton", **cpu.scales()
    )
    what = f"fp8 triton CUDA vs CPU {prefix_lens[:2]} T={num_draft} H={num_heads} {mask}"
    assert_close_bf16(out_gpu.cpu(), out_cpu, what)
    assert_lse_close(lse_gpu.cpu(), lse_cpu, what)
    assert relative_distance(out_gpu.cpu(), out_cpu) < 2e-3, what


TRITON_MATCH_BOUND = 0.01
"""Relative Frobenius distance of fp8_numerics="triton" to SGLang's Triton fp8 path (whose
running max moves per 64-token block on sm_90, per 32 on sm_120, the kernel's tile)."""


@pytest.mark.parametrize(("prefix_lens", "num_draft", "num_heads", "mask"), TRITON_CASES)
def test_fp8_triton_numerics_match_sglang_triton_fp8(
    prefix_lens, num_draft, num_heads, mask
) -> None:
    """With q as the model sends it (not e4m3-exact): the triton mode is within
    TRITON_MATCH_BOUND of SGLang's Triton fp8 path and at least 4x closer to it than the fp16
    mode, which is in turn closer to the float32 reference."""
    extend = _sglang_extend()
    case = fp8_case(prefix_lens, num_draft, num_heads, mask=mask, seed=13)
    theirs = extend(*case.args(), max_draft_tokens=num_draft, **case.scales())
    triton_mode, _ = run_fp8_triton(case)
    fp16_mode, _ = run_fp8(case)
    exact = verify_attention_reference(*case.args(), **case.scales())
    what = f"fp8 triton vs SGLang Triton fp8 {prefix_lens[:2]} T={num_draft} H={num_heads} {mask}"
    near, far = relative_distance(triton_mode, theirs), relative_distance(fp16_mode, theirs)
    print(f"{what}: triton mode {near:.3g}, fp16 mode {far:.3g} from SGLang's Triton")
    assert near <= TRITON_MATCH_BOUND, f"{what}: {near:.3g} (fp16 mode: {far:.3g})"
    assert 4 * near <= far, f"{what}: triton mode {near:.3g} not 4x closer than fp16's {far:.3g}"
    assert relative_distance(fp16_mode, exact) < relative_distance(triton_mode, exact), what


def test_fp8_triton_numerics_cuda_graph_replay_equals_eager() -> None:
    """The row-max pass and the attention pass replay in a graph with new metadata."""
    case = fp8_case((3000, 12000, 0, 65), 8, 16, mask="tree", seed=2)
    plan = make_plan(4, 16, 32, "cuda")
    out = torch.empty(32, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(32, 16, dtype=torch.float32, device="cuda")
    metadata = case.metadata(plan=plan)

    def step() -> None:
        plan.update(case.qo_indptr, case.kv_indptr, case.mask_indptr)
        verify_attention_cuda(
            metadata, *case.layer(), out, lse, fp8_numerics="triton", **case.scales()
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    eager_out, eager_lse = run_fp8_triton(case)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert plan.max_splits > 1, "the case must exercise the row-max pass"
