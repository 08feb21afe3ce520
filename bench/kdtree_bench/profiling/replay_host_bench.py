"""Host time the SGLang backend adds before each CUDA-graph replay of a verify forward.

Under CUDA graphs a verify step runs no per-layer Python: what the backend adds on the host is
its hook in ``init_forward_metadata_out_graph``, once per replay (the plan update, the step and
kernel-call counters, the shadow gate). When the GPU work per step is small (a short prefix, a
small batch) SGLang's step is bound by its host loop, so that time is paid in full every step.

Measured on the CPU with SGLang's real backend (``kdtree_inference.sglang.testing``): ours
with ``KDTREE_VERIFY=on``, DeepSeek-V3's 61 layers, batch 1, 8 draft tokens, a graph captured
through every layer's ``forward_extend``, and the metrics in SGLang's ``--enable-metrics`` mode
(``PROMETHEUS_MULTIPROC_DIR``: every counter update is a file-backed write). Reported:
``added_us``, the host µs of ``_kdtree_begin_forward`` per replay, median over repetitions with
min and max after a warm-up. It leaves out the plan update, a device kernel (CUDA only;
``layer_bench.py`` measures its host time on the GPU), and the parent's own refresh, which on a
CPU runs SGLang's index kernels in Triton's interpreter and so says nothing of a GPU host.

Usage: python -m kdtree_bench.profiling.replay_host_bench [--out bench/results/replay_host_cpu.json]
The printed lines are also written next to the JSON as a .log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kdtree_bench.profiling.spread import median_spread

LAYERS = 61  # DeepSeek-V3
HEADS = 16
DRAFT = 8
PREFIX = 64


def timed_us(fn, calls: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Per-call host µs of ``fn``: median over ``repeats`` runs of ``calls`` calls, with spread."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return median_spread(runs, digits=2)


def measure(calls: int, repeats: int, warmup: int) -> dict[str, Any]:
    import torch
    from prometheus_client import CollectorRegistry

    import kdtree_inference
    from kdtree_inference.sglang import testing
    from kdtree_inference.sglang.backend import KdtreeTritonAttnBackend
    from kdtree_inference.sglang.forward_state import Phase
    from kdtree_inference.sglang.modes import VerifyMode, VerifySettings

    layer_ids = list(range(LAYERS))

    def runner():
        return testing.make_model_runner(
            num_heads=HEADS, num_draft=DRAFT, num_layers=LAYERS, max_batch=1, max_context=256
        )

    ours_runner = runner()
    registry = CollectorRegistry()
    ours = testing.make_backend(
        KdtreeTritonAttnBackend,
        ours_runner,
        kdtree_settings=VerifySettings(mode=VerifyMode.ON),
        kdtree_registry=registry,
    )
    ours.init_cuda_graph_state(max_bs=1, max_num_tokens=DRAFT)
    ours_batch = testing.make_verify_batch(ours_runner, [PREFIX], DRAFT, HEADS, layer_ids, seed=1)
    # Capture: the metadata at capture time, then every layer once (the routes a replay counts).
    ours.init_forward_metadata_out_graph(ours_batch.forward_batch, in_capture=True)
    with torch.no_grad():
        for layer_id in layer_ids:
            ours.forward_extend(
                *ours_batch.qkv[layer_id],
                testing.make_layer(layer_id, HEADS),
                ours_batch.forward_batch,
            )
    routes = ours._kdtree_graph_routes[1]
    if sorted(routes) != layer_ids or set(routes.values()) != {"kernel"}:
        raise RuntimeError(f"capture did not route every layer to the kernel: {routes}")

    def added():
        ours._kdtree_begin_forward(phase=Phase.REPLAY, batch_size=1)

    result = {
        "kdtree_inference": str(Path(kdtree_inference.__file__).resolve().parent),
        "added_us": timed_us(added, calls, repeats, warmup),
    }
    # Every replay counted all 61 kernel calls (the hook did its whole job each time).
    replays = registry.get_sample_value("kdtree_verify_steps_total", {"tp_rank": "0"})
    kernel_calls = registry.get_sample_value("kdtree_verify_kernel_calls_total", {"tp_rank": "0"})
    if kernel_calls != replays * LAYERS:
        raise RuntimeError(f"{replays} replays counted {kernel_calls} kernel calls")
    result["replays_counted"] = int(replays)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the record here (and a .log beside it)")
    parser.add_argument("--calls", type=int, default=5000, help="replays per timed repetition")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=500)
    args = parser.parse_args()
    if min(args.calls, args.repeats) < 1 or args.warmup < 0:
        parser.error("--calls and --repeats must be at least 1, --warmup at least 0")

    # As SGLang's --enable-metrics: set before prometheus_client is first imported.
    metrics_dir = tempfile.mkdtemp(prefix="kdtree-replay-bench-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from kdtree_inference.sglang import testing

    with testing.sglang_cpu_context():
        result = measure(args.calls, args.repeats, args.warmup)
    record = {
        "what": "host µs the backend adds per CUDA-graph replay, 61 layers, batch 1, on",
        "host": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "layers": LAYERS,
        "calls": args.calls,
        "repeats": args.repeats,
        "warmup": args.warmup,
        **result,
    }
    lines = [
        f"kdtree_inference from {record['kdtree_inference']}",
        *(
            f"{name}: median {record[name]['median']} µs "
            f"(min {record[name]['min']}, max {record[name]['max']})"
            for name in ("added_us",)
        ),
    ]
    for line in lines:
        print(line)
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        args.out.with_suffix(".log").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
