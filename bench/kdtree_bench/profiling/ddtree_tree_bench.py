"""What DDTree's tree costs per decode step, outside the draft and the verify forwards.

Between the draft's top-k and the commit, the worker runs the tree search, the verify layout, the
greedy walk and the KV moves (``kdtree_inference.ddtree.tree``): about two hundred small kernels.
It replays the search and the walk as CUDA graphs (``kdtree_inference.ddtree.step_graphs``),
the search either torch's batched sorts (``graphs``) or one Triton kernel per request
(``graphs_triton``, ``kdtree_inference.ddtree.heap_search``); the ``eager`` arm runs the torch
ops one by one, as the worker did before. Reported per step, for each
arm, budget and batch at one prefix length: ``host_us``, the host time to enqueue them (what a
step bound by SGLang's host loop pays), and ``gpu_us``, their GPU time between CUDA events; each
the median over repetitions, with min and max, after a warm-up (which captures the graphs).

Usage: python -m kdtree_bench.profiling.ddtree_tree_bench [--out F.json] [--profile BUDGET]
[--memory N] (CUDA only); ``--profile`` adds PyTorch's profiler table of one budget's steps (host
and GPU time per op), ``--memory`` the GPU memory the graphs of batch sizes 1..N hold, in one
shared pool (as the worker captures them) and in a pool per batch size.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kdtree_bench.profiling.spread import median_spread
from kdtree_inference.ddtree.step_graphs import TreeStepGraphs, tree_search
from kdtree_inference.ddtree.tree import accept_step, layout_from_nodes, search_nodes

DEPTH, TOP_K, VOCAB = 15, 8, 4096


ARMS = ("graphs", "graphs_triton", "eager")
"""``graphs``: the torch search and the walk as CUDA graphs, as the worker runs them by default;
``graphs_triton``: the same with the search as one Triton kernel (``KDTREE_DDTREE_SEARCH=triton``);
``eager``: the torch ops one by one."""


def step_inputs(budget: int, batch: int) -> tuple[torch.Tensor, ...]:
    """Random draft top-k for ``batch`` requests (roots, tokens, log-probs), then the target's
    predictions and the verify window's slots for a tree of ``budget`` nodes."""
    gen = torch.Generator(device="cuda").manual_seed(budget * 100 + batch)
    logits = torch.randn(batch, DEPTH, VOCAB, device="cuda", generator=gen)
    logprobs, tokens = torch.log_softmax(logits, -1).topk(TOP_K, dim=-1)
    roots = torch.randint(0, VOCAB, (batch,), device="cuda", generator=gen)
    width = budget + 1
    window = torch.arange(batch * width, device="cuda").view(batch, width)
    predict = torch.randint(0, VOCAB, (batch, width), device="cuda", generator=gen)
    return roots, tokens, logprobs, predict, window


def tree_step(budget: int, batch: int, prefix: int, arm: str) -> Callable[[], None]:
    """One decode step's tree stretch on random draft top-k: ``graphs`` as the worker runs it,
    ``eager`` op by op."""
    roots, tokens, logprobs, predict, window = step_inputs(budget, batch)
    prefix_cpu = torch.full((batch,), prefix, dtype=torch.int64)
    prefix_lens = prefix_cpu.cuda()
    graphs = TreeStepGraphs(budget, tree_search("triton" if arm == "graphs_triton" else "torch"))

    def step() -> None:
        if arm == "eager":
            nodes = search_nodes(roots, tokens, logprobs, budget)
        else:
            nodes = graphs.search(roots, tokens, logprobs)
        layout_from_nodes(nodes, prefix_lens, prefix_cpu)
        if arm == "eager":
            accept_step(nodes, predict, window)
        else:
            graphs.accept(predict, window)

    return step


def measure(
    budget: int, batch: int, prefix: int, arm: str, repeats: int, warmup: int
) -> dict[str, Any]:
    step = tree_step(budget, batch, prefix, arm)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    host, gpu = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        start.record()
        began = time.perf_counter()
        step()
        host.append((time.perf_counter() - began) * 1e6)
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3)
    return {
        "arm": arm,
        "budget": budget,
        "batch": batch,
        "prefix": prefix,
        "host_us": median_spread(host, digits=1),
        "gpu_us": median_spread(gpu, digits=1),
    }


def graph_memory(budget: int, batches: int, shared: bool) -> dict[str, Any]:
    """GPU memory held once the search and the walk are captured for batch sizes 1..``batches``:
    ``shared``, by one ``TreeStepGraphs`` (one pool, as a server holds them), else by one per
    batch size (a pool each). Measured as the memory reserved beyond what was before, after
    ``empty_cache`` (which returns cached memory, but not the graphs' pools)."""
    inputs = step_inputs(budget, batches)
    gc.collect()  # the graphs of an earlier measurement, their pools with them
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    held = [TreeStepGraphs(budget)]
    for batch in range(1, batches + 1):
        if not shared and batch > 1:
            held.append(TreeStepGraphs(budget))
        roots, tokens, logprobs, predict, window = (x[:batch] for x in inputs)
        held[-1].search(roots, tokens, logprobs)
        held[-1].accept(predict, window)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {
        "budget": budget,
        "batch_sizes": batches,
        "pool": "shared" if shared else "one per batch size",
        "held_mib": round((torch.cuda.memory_reserved() - before) / 2**20, 1),
    }


def profile_table(budget: int, prefix: int, steps: int = 20) -> str:
    """PyTorch's per-op table of ``steps`` warm eager tree stretches at batch 1, by host time."""
    step = tree_step(budget, 1, prefix, "eager")
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return profiler.key_averages().table(sort_by="cpu_time_total", row_limit=40)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="8,16,32,64")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prefix", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", type=Path, help="write the records here as JSON")
    parser.add_argument(
        "--profile", type=int, metavar="BUDGET", help="PyTorch's profiler table for this budget"
    )
    parser.add_argument(
        "--memory",
        type=int,
        metavar="N",
        help="also the memory the graphs of batch sizes 1..N hold at each budget, one shared "
        "pool against a pool per batch size",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    if args.repeats < 1 or args.warmup < 1:
        parser.error("--repeats and --warmup must be at least 1 (the warm-up captures the graphs)")
    records = []
    budgets = [int(b) for b in args.budgets.split(",")]
    for budget in budgets:
        for batch in (int(b) for b in args.batches.split(",")):
            for arm in ARMS:
                record = measure(budget, batch, args.prefix, arm, args.repeats, args.warmup)
                records.append(record)
                host, gpu = record["host_us"], record["gpu_us"]
                print(
                    f"{arm:>6} budget {budget:>2} batch {batch}: "
                    f"host {host['median']} µs [{host['min']}, {host['max']}], "
                    f"gpu {gpu['median']} µs [{gpu['min']}, {gpu['max']}]",
                    flush=True,
                )
    memory = []
    for budget in budgets if args.memory else ():
        for shared in (True, False):
            memory.append(graph_memory(budget, args.memory, shared))
            print(
                f"memory budget {budget:>2}, batch sizes 1..{args.memory}, "
                f"{memory[-1]['pool']}: {memory[-1]['held_mib']} MiB",
                flush=True,
            )
    if args.profile:
        print(profile_table(args.profile, args.prefix), flush=True)
    if args.out:
        device = torch.cuda.get_device_name()
        result = {"device": device, "records": records, "memory": memory}
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
