"""Kernel benchmark: kdtree's CUDA verify kernel vs SGLang's Triton kernels on the same inputs.

Contenders per shape (one GPU, bf16, DeepSeek-V3 MLA dims, fragmented kv_indices):
- kdtree        ``kdtree_verify.cuda.verify_attention_cuda``: one layer call (attention + combine
                kernels) with the plan made once per forward, as the SGLang backend runs it:
                ``kdtree_us = kdtree_layer_us + kdtree_plan_us / 61`` (DeepSeek-V3's layers), both
                parts timed and recorded; random tree mask;
- triton_extend SGLang 0.5.23 ``extend_attention_fwd`` (what SGLang runs on NVIDIA), same tree;
- triton_shared_kv SGLang ``verify_shared_kv_fwd`` (chain/causal masks only; null where it
                declines);
- reference     the float32 torch reference (small shapes only).
Ceilings measured in the same run: device copy bandwidth and a bf16 8192^3 torch matmul rate.

Timing: each contender is captured in a CUDA graph as K calls (K = 1..10, so that a replay takes
~40 ms), each preceded by an L2 flush (zeroing a 256 MiB buffer); a graph of the K flushes alone is
timed too and subtracted, so the figure is the per-call time with a cold L2, as in a real forward
where 61 layers stream their KV. Median of 5 replays (2-3 for the slow baselines).
``--l2`` picks the L2 state each call meets (a diagnostic; every record is ``flushed``):
``flushed`` as above (the flush leaves L2 full of dirty lines, which the call's misses must
write back), ``clean`` (the flush reads the buffer instead: L2 full of clean, unrelated lines),
``warm`` (no flush: what the previous call left, e.g. the whole KV of a small shape).

Usage: python -m kdtree_bench.kernel.kernel_bench [--out bench/results/h200.json] [--quick] [--kdtree-only]
                                   [--part K/N] [--l2 flushed|clean|warm] [--target-ctas N]
       python -m kdtree_bench.kernel.kernel_bench --merge part1.json part2.json ... --out bench/results/h200.json
``--part K/N`` runs every N-th grid shape starting at the K-th (the Triton baselines compile per
shape, so the whole grid with baselines takes longer than one 10-minute GPU command);
``--merge`` joins the parts into one result (ceilings from the first part, records in grid order).
``--kdtree-only`` skips the baselines (for tuning runs). ``--target-ctas N`` plans every shape
for N CTAs instead of one wave of the device (a diagnostic of the split size: fewer CTAs give
longer, fewer splits); each record states its ``target_ctas`` and ``split_tokens``.

``--kv-dtype fp8``: the pool is float8_e4m3fn (K / k_scale, as SGLang stores it; q and the draft
KV bf16) and the contenders are kdtree on the fp8 pool (``kdtree_us``), kdtree on the bf16 pool of
the same values (``kdtree_bf16_us``, a layer call; ``speedup_fp8_vs_bf16`` compares layer calls) and SGLang's Triton
``extend_attention_fwd`` on the fp8 pool with the same descales (``triton_fp8_extend_us``). The
default shapes are FP8_SHAPES (the memory-bound B >= 8, H = 8, T = 8, prefix >= 32k and a few
others); the roofline counts one byte per pool element.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kdtree_bench.kernel import mma_ceiling
from kdtree_verify import (
    QK_DIM,
    V_DIM,
    VerifyMetadata,
    deepseek_v3_sm_scale,
    verify_attention_reference,
)
from kdtree_verify.cuda import verify_attention_cuda
from kdtree_verify.plan import make_plan, split_chunk
from kdtree_verify.testing import random_tree_parents, sglang_extend_attention, tree_visibility

QK, DV = QK_DIM, V_DIM
GRID_B = (1, 8, 32)
GRID_H = (8, 16, 128)
GRID_T = (8, 16, 32)
GRID_PREFIX = (4096, 32768, 131072)
EXTEND_MAX_B_X_PREFIX = 262_144  # above this the Triton extend kernel takes seconds per shape
REFERENCE_MAX_WORK = 1 * 16 * 16 * 32768
LAYERS = 61
"""DeepSeek-V3's layers: the SGLang backend plans once per forward and every layer reuses it."""
FP8_SHAPES = [
    (8, 8, 8, 32768),
    (8, 8, 8, 131072),
    (32, 8, 8, 32768),
    (32, 8, 8, 131072),
    (16, 8, 8, 65536),
    (1, 8, 8, 32768),
    (8, 16, 16, 4096),
    (8, 8, 16, 32768),
    (1, 128, 16, 32768),
]
"""``--kv-dtype fp8`` default shapes (B, H, T, prefix)."""
FP8_K_SCALE, FP8_V_SCALE = 0.5, 0.5
"""The pool holds K / k_scale; MLA's V is the same rows, so v_scale = k_scale."""


def log(msg: str) -> None:
    print(msg, flush=True)


def grid_shapes() -> list[tuple[int, int, int, int]]:
    """The benchmark grid as (B, H, T, prefix), in the order records are written."""
    return [(B, H, T, P) for B in GRID_B for H in GRID_H for T in GRID_T for P in GRID_PREFIX]


def parse_part(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N, e.g. 1/2; got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"need 1 <= K <= N; got {text!r}")
    return k, n


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}")
    return value


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """'1x8x8x32768,8x16x16x4096' -> [(1, 8, 8, 32768), (8, 16, 16, 4096)]."""
    try:
        shapes = [tuple(int(x) for x in item.split("x")) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BxHxTxP,...; got {text!r}") from None
    if not shapes or any(len(shape) != 4 or min(shape) < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"expected BxHxTxP,... with positive sizes; got {text!r}")
    return shapes


def merge_parts(paths: list[str], out: str) -> Path:
    """Join --part / --shapes results into one: records in grid order, the first part's ceilings
    and metadata (each part's own ceilings are kept under `parts`), `complete` when the records
    cover the grid exactly once, and the summary recomputed."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    timings = {part.get("timing") for part in parts}
    if len(timings) > 1:  # e.g. an --l2 warm part among flushed ones
        raise ValueError(f"merge: the parts were timed differently: {sorted(map(str, timings))}")
    order = {shape: i for i, shape in enumerate(grid_shapes())}
    records = sorted(
        (r for part in parts for r in part["records"]),
        key=lambda r: order.get((r["B"], r["H"], r["T"], r["prefix"]), len(order)),
    )
    merged = dict(parts[0])
    merged["parts"] = [
        {"file": Path(p).name, "ceilings": part["ceilings"], "complete": part["complete"]}
        for p, part in zip(paths, parts, strict=True)
    ]
    shapes = [(r["B"], r["H"], r["T"], r["prefix"]) for r in records]
    merged["complete"] = len(shapes) == len(set(shapes)) and set(shapes) == set(order)
    merged["records"] = records
    merged["summary"] = summarize(records)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(merged, indent=1) + "\n")
    return out_path


class Timer:
    """Per-call GPU time of a closure from CUDA-graph replays with an L2 flush before each call.

    The number of calls per graph adapts so that one replay takes about ``graph_ms`` (at most
    ``max_calls``); the median of ``reps`` replays is reported.
    """

    def __init__(
        self,
        graph_ms: float = 40.0,
        max_calls: int = 10,
        flush_bytes: int = 256 << 20,
        l2: str = "flushed",
    ):
        if l2 not in L2_STATES:
            raise ValueError(f"l2: one of {', '.join(L2_STATES)}, got {l2!r}")
        self.graph_ms = graph_ms
        self.max_calls = max_calls
        # warm needs no buffer; zeros so that the clean flush reads initialized memory
        self.flush_buf = (
            None if l2 == "warm" else torch.zeros(flush_bytes, dtype=torch.uint8, device="cuda")
        )
        self.l2 = l2
        self._flush_us: dict[int, float] = {}

    def flush(self) -> None:
        """Put L2 into this timer's state (a kernel on the current stream; none for warm)."""
        if self.l2 == "flushed":
            self.flush_buf.zero_()
        elif self.l2 == "clean":
            self.flush_buf.amax()  # reads every line, writes one byte

    def _capture(self, fn, calls: int) -> torch.cuda.CUDAGraph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up (Triton compiles, caches fill) outside the capture
            self.flush()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                self.flush()
                fn()
        return graph

    def _graph_us(self, fn, calls: int, reps: int) -> float:
        graph = self._capture(fn, calls)
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / calls)
        del graph
        return statistics.median(times)

    def _eager_ms(self, fn) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def per_call_us(self, fn, reps: int = 5) -> float:
        est_ms = self._eager_ms(fn)
        calls = max(1, min(self.max_calls, int(self.graph_ms / max(est_ms, 1e-3))))
        if est_ms > 2 * self.graph_ms:
            reps = min(reps, 2)
        if calls not in self._flush_us:
            self._flush_us[calls] = self._graph_us(lambda: None, calls, 5)
        return max(0.0, self._graph_us(fn, calls, reps) - self._flush_us[calls])


L2_STATES = {
    "flushed": "L2 flushed (256 MiB zeroed) before each call",
    "clean": "L2 refilled with clean lines (256 MiB read) before each call",
    "warm": "no flush: L2 as the previous call left it",
}
"""``--l2`` choices and how the result's ``timing`` field describes each."""


def timing_note(l2: str) -> str:
    return f"CUDA-graph replay, {L2_STATES[l2]}, flush time subtracted"


def measure_ceilings() -> dict:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    end.synchronize()
    copy_tbps = 2 * n * reps / (start.elapsed_time(end) * 1e-3) / 1e12
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start.record()
    reps = 20
    for _ in range(reps):
        a @ b
    end.record()
    end.synchronize()
    tflops = 2 * 8192**3 * reps / (start.elapsed_time(end) * 1e-3) / 1e12
    ceilings = {"copy_TBps": round(copy_tbps, 3), "matmul_TFLOPs": round(tflops, 1)}
    ceilings["mma_sync_TFLOPs"] = measure_mma_sync_ceiling()
    return ceilings


def measure_mma_sync_ceiling() -> float | None:
    """The best mma.sync rate of bench/kdtree_bench/kernel/mma_ceiling.py (None, logged, where nvcc is missing)."""
    props = torch.cuda.get_device_properties(0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lib = mma_ceiling.build(f"{props.major}{props.minor}", Path(tmp))
            rates = mma_ceiling.measure(mma_ceiling.load(lib), props.multi_processor_count)
    except RuntimeError as exc:
        log(f"mma.sync ceiling unavailable: {exc}")
        return None
    log(f"mma.sync ceilings: {rates}")
    return max(rates.values())


class Pool:
    """One shared paged KV pool; each shape scatters its prefixes over random slots of it."""

    def __init__(self, rows: int, gen: torch.Generator):
        self.rows = rows
        self.k = torch.empty(rows, 1, QK, dtype=torch.bfloat16, device="cuda")
        chunk = 1 << 20
        for lo in range(0, rows, chunk):
            hi = min(rows, lo + chunk)
            self.k[lo:hi].normal_(generator=gen)
        self.v = self.k[..., :DV]


def build_inputs(pool: Pool, B: int, H: int, T: int, prefix: int, gen: torch.Generator) -> dict:
    dev = "cuda"
    total_q = B * T
    slots = torch.randperm(pool.rows, device=dev, generator=gen)[: B * prefix + total_q]
    kv_indices = slots[: B * prefix].contiguous()
    q = torch.randn(total_q, H, QK, dtype=torch.bfloat16, device=dev, generator=gen)
    k_ext = torch.randn(total_q, 1, QK, dtype=torch.bfloat16, device=dev, generator=gen)
    qo_indptr = torch.arange(B + 1, dtype=torch.int64, device=dev) * T
    kv_indptr = torch.arange(B + 1, dtype=torch.int64, device=dev) * prefix
    cpu_gen = torch.Generator().manual_seed(B * 1000 + H * 10 + T)
    vis = [tree_visibility(random_tree_parents(T, cpu_gen)) for _ in range(B)]
    row = prefix + T
    mask = torch.ones(B, T, row, dtype=torch.uint8, device=dev)
    mask[:, :, prefix:] = torch.stack(vis).to(dev, torch.uint8)
    mask_indptr = torch.arange(B + 1, dtype=torch.int64, device=dev) * (T * row)
    return {
        "q": q,
        "k_ext": k_ext,
        "v_ext": k_ext[..., :DV],
        "qo_indptr": qo_indptr,
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "mask": mask.flatten(),
        "mask_indptr": mask_indptr,
    }


def forward_metadata(inp: dict, sm_scale: float, plan=None) -> VerifyMetadata:
    """The forward's metadata of ``build_inputs``' tensors (built once, shared by every layer)."""
    return VerifyMetadata.build(
        inp["qo_indptr"],
        inp["kv_indptr"],
        inp["kv_indices"],
        inp["mask"],
        inp["mask_indptr"],
        sm_scale,
        plan=plan,
    )


def kdtree_layer_call(
    pool: Pool, inp: dict, out: torch.Tensor, lse: torch.Tensor, plan, sm_scale: float
) -> Callable[[], None]:
    """One layer call of our kernel on ``build_inputs``' tensors with a planned workspace."""
    metadata = forward_metadata(inp, sm_scale, plan)

    def call() -> None:
        verify_attention_cuda(
            metadata, inp["q"], inp["k_ext"], inp["v_ext"], pool.k, pool.v, out, lse
        )

    return call


def kdtree_fp8_layer_call(
    pool_fp8: torch.Tensor,
    inp: dict,
    out: torch.Tensor,
    lse: torch.Tensor,
    plan,
    sm_scale: float,
    fp8_numerics: str = "fp16",
) -> Callable[[], None]:
    """One layer call of our kernel on the fp8 pool (the same plan: it depends on shapes only),
    rounding per ``fp8_numerics``."""
    metadata = forward_metadata(inp, sm_scale, plan)

    def call() -> None:
        verify_attention_cuda(
            metadata,
            inp["q"],
            inp["k_ext"],
            inp["v_ext"],
            pool_fp8,
            pool_fp8[..., :DV],
            out,
            lse,
            k_scale=FP8_K_SCALE,
            v_scale=FP8_V_SCALE,
            fp8_numerics=fp8_numerics,
        )

    return call


def ideal_us(nbytes: float, flops: float, copy_tbps: float, tflops: float) -> float:
    """The roofline time: the slower of moving the bytes and doing the FLOPs at these rates."""
    return max(nbytes / (copy_tbps * 1e12), flops / (tflops * 1e12)) * 1e6


def roofline(
    B: int, H: int, T: int, prefix: int, ceilings: dict, pool_bytes: int = 2
) -> tuple[float, float, float]:
    """(bytes, flops, ideal_us): KV read once + Q read + out write; QK^T and PV over prefix + T.
    ``pool_bytes`` per prefix element (1 for an fp8 pool; the draft KV stays bf16)."""
    nbytes = B * prefix * QK * pool_bytes + B * T * QK * 2 + B * T * H * (QK + DV) * 2
    flops = 2.0 * B * T * H * (prefix + T) * (QK + DV)
    return nbytes, flops, ideal_us(nbytes, flops, ceilings["copy_TBps"], ceilings["matmul_TFLOPs"])


def mma_sync_efficiency(nbytes: float, flops: float, us: float, ceilings: dict) -> float | None:
    """Roofline efficiency against the mma.sync ceiling instead of cuBLAS's (wgmma) matmul rate:
    how far the kernel is from what sm_80-level code can do on this GPU."""
    if not ceilings.get("mma_sync_TFLOPs"):
        return None
    ideal = ideal_us(nbytes, flops, ceilings["copy_TBps"], ceilings["mma_sync_TFLOPs"])
    return round(ideal / us, 3)


def summarize(records: list[dict]) -> dict:
    """Summary figures of the records: efficiency, small-call time, ratios to the baselines."""
    big = [r for r in records if r["ideal_us"] >= 10.0]
    small = [r for r in records if r["ideal_us"] < 10.0]
    return {
        "efficiency_median_ideal_ge_10us": statistics.median(r["roofline_efficiency"] for r in big)
        if big
        else None,
        "efficiency_min_ideal_ge_10us": min(r["roofline_efficiency"] for r in big) if big else None,
        "max_us_ideal_lt_10us": max(r["kdtree_us"] for r in small) if small else None,
        "mma_sync_efficiency_median_ideal_ge_10us": statistics.median(
            r["mma_sync_roofline_efficiency"] for r in big
        )
        if big and all(r.get("mma_sync_roofline_efficiency") is not None for r in big)
        else None,
        "min_speedup_vs_extend_B1_H8_T_le16_prefix_ge32k": min(
            (
                r["speedup_vs_extend"]
                for r in records
                if r["B"] == 1
                and r["H"] == 8
                and r["T"] <= 16
                and r["prefix"] >= 32768
                and "speedup_vs_extend" in r
            ),
            default=None,
        ),
        "min_speedup_vs_shared_kv": min(
            (r["speedup_vs_shared_kv"] for r in records if "speedup_vs_shared_kv" in r),
            default=None,
        ),
    }


def summarize_fp8(records: list[dict]) -> dict:
    """The fp8 target: at B >= 8, H = 8, T = 8, prefix >= 32k, fp8 >= 1.6x the bf16 pool."""
    target = [
        r for r in records if r["B"] >= 8 and r["H"] == 8 and r["T"] == 8 and r["prefix"] >= 32768
    ]
    return {
        "min_speedup_fp8_vs_bf16_B_ge8_H8_T8_prefix_ge32k": min(
            (r["speedup_fp8_vs_bf16"] for r in target), default=None
        ),
        "min_speedup_vs_triton_fp8": min(
            (r["speedup_vs_triton_fp8"] for r in records if "speedup_vs_triton_fp8" in r),
            default=None,
        ),
    }


def write_result(
    out: str,
    props,
    ceilings: dict,
    records: list[dict],
    summary: dict | None,
    l2: str = "flushed",
    kv_dtype: str = "bf16",
) -> Path:
    """Write the JSON (also after every shape, so a run cut short keeps what it measured)."""
    result = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": "bfloat16",
        "kv_dtype": "float8_e4m3fn" if kv_dtype == "fp8" else "bfloat16",
        "timing": timing_note(l2),
        "extend_skipped_when_B_x_prefix_gt": EXTEND_MAX_B_X_PREFIX,
        "complete": summary is not None,
        "ceilings": ceilings,
        "summary": summary if summary is not None else summarize(records),
        "records": records,
    }
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    return out_path


QUICK_SHAPES = [(1, 8, 8, 32768), (1, 16, 16, 131072), (8, 16, 16, 4096), (1, 128, 32, 32768)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/h200.json")
    parser.add_argument("--quick", action="store_true", help="a 4-shape smoke run")
    parser.add_argument("--kdtree-only", action="store_true", help="skip the Triton baselines")
    parser.add_argument("--part", type=parse_part, default=(1, 1), metavar="K/N")
    parser.add_argument("--merge", nargs="+", metavar="PART_JSON", help="join --part results")
    parser.add_argument(
        "--shapes", type=parse_shapes, metavar="BxHxTxP,...", help="these grid shapes, in order"
    )
    parser.add_argument(
        "--l2", choices=list(L2_STATES), default="flushed", help="L2 state before each call"
    )
    parser.add_argument(
        "--kv-dtype", choices=["bf16", "fp8"], default="bf16", help="the KV pool's dtype"
    )
    parser.add_argument(
        "--target-ctas",
        type=positive_int,
        metavar="N",
        help="plan for N CTAs instead of one wave of the device (a split-size diagnostic)",
    )
    return parser


def selected_shapes(args: argparse.Namespace) -> list[tuple[int, int, int, int]]:
    """The shapes to measure: --shapes as given, else the fp8 list, the quick list or the grid,
    every N-th from the K-th for --part K/N."""
    if args.shapes:
        return args.shapes
    k, n = args.part
    if args.kv_dtype == "fp8":
        shapes = FP8_SHAPES
    elif args.quick:
        shapes = QUICK_SHAPES
    else:
        shapes = grid_shapes()
    return shapes[k - 1 :: n]


def sglang_baselines(kdtree_only: bool, fp8: bool) -> tuple[Callable | None, Callable | None]:
    """SGLang's extend_attention_fwd and verify_shared_kv_fwd, or None for each one not run:
    unavailable, --kdtree-only, or shared-KV on the fp8 pool (chain-only, not a contender)."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
        from sglang.kernels.ops.attention.verify_mla import verify_shared_kv_fwd
    except ImportError as exc:  # the run is still useful without the baselines; say so
        log(f"SGLang kernels unavailable ({exc}); baselines will be null")
        extend_attention_fwd = verify_shared_kv_fwd = None
    if kdtree_only:
        extend_attention_fwd = verify_shared_kv_fwd = None
    if fp8:
        verify_shared_kv_fwd = None  # chain-only and not an fp8 contender here
    return extend_attention_fwd, verify_shared_kv_fwd


class ShapeBench:
    """What every shape of one run shares: the pools, the timer, the ceilings, the contenders."""

    def __init__(
        self,
        args: argparse.Namespace,
        shapes: list,
        ceilings: dict,
        baselines: tuple[Callable | None, Callable | None],
    ) -> None:
        self.fp8 = args.kv_dtype == "fp8"
        self.target_ctas = args.target_ctas
        self.ceilings = ceilings
        self.extend_fwd, self.shared_kv_fwd = baselines
        self.sm_scale = deepseek_v3_sm_scale()
        self.gen = torch.Generator(device="cuda").manual_seed(0)
        pool_rows = max(B * P + B * T for B, _, T, P in shapes) + 1024
        log(f"pool: {pool_rows} rows ({pool_rows * QK * 2 / 1e9:.2f} GB)")
        self.pool = Pool(pool_rows, self.gen)
        # fp8: SGLang's store of the same K (K / k_scale in e4m3); V its first 512 columns.
        self.pool_fp8 = (self.pool.k / FP8_K_SCALE).to(torch.float8_e4m3fn) if self.fp8 else None
        self.timer = Timer(l2=args.l2)

    def measure(self, B: int, H: int, T: int, P: int) -> dict:
        """One shape's record: our kernel, then each baseline on the same inputs."""
        inp = build_inputs(self.pool, B, H, T, P, self.gen)
        total_q = B * T
        out = torch.empty(total_q, H, DV, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(total_q, H, dtype=torch.float32, device="cuda")
        plan = make_plan(B, H, total_q, "cuda", target_ctas=self.target_ctas)
        rec = {"B": B, "H": H, "T": T, "prefix": P, "mask": "tree"}
        kdtree_call, triton_mode_call = self.time_kdtree(rec, inp, out, lse, plan)
        rec["triton_extend_us"] = None
        rec["max_abs_diff_vs_extend"] = None
        if self.extend_fwd is not None and B * P <= EXTEND_MAX_B_X_PREFIX:
            self.time_triton_extend(rec, inp, out, kdtree_call, triton_mode_call)
        rec["triton_shared_kv_us"] = None
        if self.shared_kv_fwd is not None:
            self.time_shared_kv(rec, inp, out)
        rec["reference_us"] = None
        if not self.fp8 and B * H * T * P <= REFERENCE_MAX_WORK:
            rec["reference_us"] = self.time_reference(inp)
        return rec

    def time_kdtree(self, rec: dict, inp: dict, out, lse, plan) -> tuple[Callable, Callable | None]:
        """Our layer call and plan update (fp8: also the bf16 pool and the triton numerics),
        with the roofline figures; returns the layer call and the triton-numerics call."""
        B, H, T, P = rec["B"], rec["H"], rec["T"], rec["prefix"]
        timer, sm_scale = self.timer, self.sm_scale

        def plan_call(inp=inp, plan=plan):
            plan.update(inp["qo_indptr"], inp["kv_indptr"], inp["mask_indptr"])

        kdtree_call = kdtree_layer_call(self.pool, inp, out, lse, plan, sm_scale)
        plan_call()
        triton_mode_call = None
        if self.fp8:
            rec["kdtree_bf16_us"] = round(timer.per_call_us(kdtree_call), 2)
            bf16_out = out.clone()
            triton_mode_call = kdtree_fp8_layer_call(
                self.pool_fp8, inp, out, lse, plan, sm_scale, fp8_numerics="triton"
            )
            # SGLang's roundings (the backend's default): the row-max pass and the eager max.
            rec["kdtree_fp8_triton_numerics_us"] = round(timer.per_call_us(triton_mode_call), 2)
            kdtree_call = kdtree_fp8_layer_call(self.pool_fp8, inp, out, lse, plan, sm_scale)
            kdtree_call()
            torch.cuda.synchronize()
            # the fp8 result against the bf16 pool's (a quantization distance, not an error)
            rec["max_abs_diff_fp8_vs_bf16"] = float((out.float() - bf16_out.float()).abs().max())
            del bf16_out
        rec["kdtree_layer_us"] = round(timer.per_call_us(kdtree_call), 2)
        rec["kdtree_plan_us"] = round(timer.per_call_us(plan_call), 2)
        rec["kdtree_us"] = round(rec["kdtree_layer_us"] + rec["kdtree_plan_us"] / LAYERS, 2)
        ceilings = self.ceilings
        nbytes, flops, ideal = roofline(B, H, T, P, ceilings, pool_bytes=1 if self.fp8 else 2)
        rec.update(
            bytes=nbytes,
            flops=flops,
            ideal_us=round(ideal, 2),
            roofline_efficiency=round(ideal / rec["kdtree_us"], 3),
            mma_sync_roofline_efficiency=mma_sync_efficiency(
                nbytes, flops, rec["kdtree_us"], ceilings
            ),
            effective_TBps=round(nbytes / rec["kdtree_us"] / 1e6, 3),
            TFLOPs=round(flops / rec["kdtree_us"] / 1e6, 1),
            max_splits=plan.max_splits,
            target_ctas=plan.target_ctas,
            split_tokens=split_chunk([(T, P)] * B, H, plan.target_ctas, plan.max_splits),
        )
        if self.fp8:
            # layer calls on both sides (the plan is shared and the same)
            rec["speedup_fp8_vs_bf16"] = round(rec["kdtree_bf16_us"] / rec["kdtree_layer_us"], 2)
            rec["triton_numerics_vs_fp16_time"] = round(
                rec["kdtree_fp8_triton_numerics_us"] / rec["kdtree_layer_us"], 2
            )
        return kdtree_call, triton_mode_call

    def time_triton_extend(
        self, rec: dict, inp: dict, out, kdtree_call: Callable, triton_mode_call: Callable | None
    ) -> None:
        """SGLang's Triton extend kernel on the run's pool, and our result against it (fp8: both
        our numerics, under the fp8 keys)."""
        ext_out = torch.empty_like(out)
        ext_meta = forward_metadata(inp, self.sm_scale)
        if self.fp8:
            k_buf, v_buf, suffix = self.pool_fp8, self.pool_fp8[..., :DV], "triton_fp8"
            scales = {"k_scale": FP8_K_SCALE, "v_scale": FP8_V_SCALE}
        else:
            k_buf, v_buf, suffix, scales = self.pool.k, self.pool.v, "extend", {}
        T = rec["T"]

        def extend_call(inp=inp, ext_out=ext_out, T=T, meta=ext_meta):
            sglang_extend_attention(
                meta,
                inp["q"],
                inp["k_ext"],
                inp["v_ext"],
                k_buf,
                v_buf,
                max_draft_tokens=T,
                out=ext_out,
                **scales,
            )

        time_key = "triton_fp8_extend_us" if self.fp8 else "triton_extend_us"
        rec[time_key] = round(self.timer.per_call_us(extend_call, reps=3), 1)
        kdtree_call()
        rec[f"max_abs_diff_vs_{suffix}"] = float((out.float() - ext_out.float()).abs().max())
        if triton_mode_call is not None:
            triton_mode_call()
            rec["max_abs_diff_triton_numerics_vs_triton_fp8"] = float(
                (out.float() - ext_out.float()).abs().max()
            )
        rec[f"speedup_vs_{suffix}"] = round(rec[time_key] / rec["kdtree_us"], 1)

    def time_shared_kv(self, rec: dict, inp: dict, out) -> None:
        """SGLang's verify_shared_kv_fwd where it accepts the shape (it declines tree masks)."""
        sk_out = torch.empty_like(out)
        pool, T, sm_scale, shared_kv_fwd = self.pool, rec["T"], self.sm_scale, self.shared_kv_fwd

        def shared_kv_call(inp=inp, sk_out=sk_out, T=T):
            return shared_kv_fwd(
                inp["q"],
                inp["k_ext"],
                inp["v_ext"],
                sk_out,
                pool.k,
                pool.v,
                inp["qo_indptr"],
                inp["kv_indptr"],
                inp["kv_indices"],
                None,
                True,
                None,
                T,
                1.0,
                1.0,
                sm_scale=sm_scale,
            )

        try:
            accepted = shared_kv_call()
        except Exception as exc:  # a decline by exception is still a decline; log it
            log(f"  verify_shared_kv_fwd raised {type(exc).__name__}: {exc}")
            accepted = False
        if accepted:
            rec["triton_shared_kv_us"] = round(self.timer.per_call_us(shared_kv_call, reps=3), 1)
            rec["speedup_vs_shared_kv"] = round(rec["triton_shared_kv_us"] / rec["kdtree_us"], 1)

    def time_reference(self, inp: dict) -> float:
        """The float32 reference's wall time for one call, after one warm-up call."""
        pool = self.pool
        args_ref = (
            forward_metadata(inp, self.sm_scale),
            inp["q"],
            inp["k_ext"],
            inp["v_ext"],
            pool.k,
            pool.v,
        )
        verify_attention_reference(*args_ref)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        verify_attention_reference(*args_ref)
        torch.cuda.synchronize()
        return round((time.perf_counter() - t0) * 1e6, 1)


def shape_line(rec: dict, fp8: bool, elapsed_s: float) -> str:
    """One shape's log line."""
    B, H, T, P = rec["B"], rec["H"], rec["T"], rec["prefix"]
    return (
        f"B={B:3d} H={H:3d} T={T:3d} prefix={P:6d}  kdtree {rec['kdtree_us']:9.2f} us "
        f"(layer {rec['kdtree_layer_us']:.2f} plan {rec['kdtree_plan_us']:.2f})  "
        f"ideal {rec['ideal_us']:8.2f} us  eff {rec['roofline_efficiency']:.3f}  "
        f"{rec['effective_TBps']:.2f} TB/s {rec['TFLOPs']:.0f} TF/s  "
        f"extend {rec['triton_extend_us']}  shared_kv {rec['triton_shared_kv_us']}  "
        f"ref {rec['reference_us']}  diff {rec['max_abs_diff_vs_extend']}  "
        + (
            f"bf16 {rec['kdtree_bf16_us']} us (fp8 x{rec['speedup_fp8_vs_bf16']})  "
            f"triton_fp8 {rec.get('triton_fp8_extend_us')}  "
            if fp8
            else ""
        )
        + f"[{elapsed_s:.0f} s]"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.merge:
        try:
            out_path = merge_parts(args.merge, args.out)
        except ValueError as exc:
            print(f"kernel_bench: {exc}", file=sys.stderr)
            return 2
        log(f"wrote {out_path}")
        return 0
    if not torch.cuda.is_available():
        print("kernel_bench: needs a CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    baselines = sglang_baselines(args.kdtree_only, args.kv_dtype == "fp8")
    props = torch.cuda.get_device_properties(0)
    log(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}")
    ceilings = measure_ceilings()
    log(f"ceilings: {ceilings}")
    shapes = selected_shapes(args)
    bench = ShapeBench(args, shapes, ceilings, baselines)
    records = []
    t_start = time.time()
    for B, H, T, P in shapes:
        rec = bench.measure(B, H, T, P)
        records.append(rec)
        log(shape_line(rec, bench.fp8, time.time() - t_start))
        write_result(args.out, props, ceilings, records, None, args.l2, args.kv_dtype)
    summary = summarize(records)
    if bench.fp8:
        summary |= summarize_fp8(records)
    summary["bench_seconds"] = round(time.time() - t_start, 1)
    log(json.dumps(summary, indent=1))
    out_path = write_result(args.out, props, ceilings, records, summary, args.l2, args.kv_dtype)
    log(f"wrote {out_path}")
    return 0 if all(math.isfinite(r["kdtree_us"]) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
