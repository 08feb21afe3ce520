"""Timeline of one layer call (probe build): L2 flush -> marker kernel -> attention -> combine.

Needs a kernel built with the timeline probe (%globaltimer stamps per CTA and the extension's
probe_marker / probe_reset / probe_read): run 54's patch on main 69bbddf (kernel 33e6a04; run 32's
probe plus a stamp when thread 0's Q fragments have landed, in the slot where run 32's stamped the
SM id), from git history (docs/kernel-journal.md):

    git show d1d7537:bench/results/gpu_run54_probe_shipped/variants/probe_q_on_main_69bbddf.patch

It does not apply to later kernels as is. Run it with that variant first on PYTHONPATH:
bench/ab_kernels.sh with NAME python3 -m kdtree_bench.profiling.probe_timeline [--l2 flushed warm].
Prints, per shape, in microseconds from the marker kernel's stamp: attention CTA entry (min,
median, max), metadata ready, Q landed, first tile landed, loop end, epilogue end; combine
entry/weights/end, and the globaltimer's observed resolution. ``--l2`` takes kernel_bench.py's
states, one timeline each (``warm``: no flush, so the call finds what the previous replay left).
"""

from __future__ import annotations

import argparse

import torch

from kdtree_bench.kernel.kernel_bench import L2_STATES, Pool, Timer, build_inputs, kdtree_layer_call
from kdtree_verify import V_DIM, deepseek_v3_sm_scale
from kdtree_verify._build import load
from kdtree_verify.plan import make_plan

SHAPES = [(1, 8, 8, 4096), (1, 16, 8, 4096), (1, 8, 8, 32768), (8, 8, 8, 4096)]
ATTN, ATTN_CTAS, COMB = 16, 4096, 16 + 8 * 4096


def min_med_max(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{xs[0]:7.2f} {xs[len(xs) // 2]:7.2f} {xs[-1]:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--l2", nargs="+", choices=list(L2_STATES), default=["flushed"], help="one timeline each"
    )
    args = parser.parse_args()
    ext = load()
    pool = Pool(
        max(B * P + B * T for B, _, T, P in SHAPES) + 1024,
        torch.Generator(device="cuda").manual_seed(0),
    )
    scale = deepseek_v3_sm_scale()
    for l2 in args.l2:
        print(f"L2: {L2_STATES[l2]}", flush=True)
        probe_shapes(ext, pool, Timer(l2=l2), scale)
    print("done")


def probe_shapes(ext, pool: Pool, timer: Timer, scale: float) -> None:
    """Print the timeline of one layer call per shape (the same inputs for every L2 state)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    for B, H, T, P in SHAPES:
        inp = build_inputs(pool, B, H, T, P, gen)
        out = torch.empty(B * T, H, V_DIM, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B * T, H, dtype=torch.float32, device="cuda")
        plan = make_plan(B, H, B * T, "cuda")
        plan.update(inp["qo_indptr"], inp["kv_indptr"], inp["mask_indptr"])

        call = kdtree_layer_call(pool, inp, out, lse, plan, scale)
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            timer.flush()
            ext.probe_marker()
            call()
        rows = []
        for _ in range(6):
            ext.probe_reset()
            torch.cuda.synchronize()
            graph.replay()
            v = ext.probe_read()
            t0 = v[0]
            a = [v[ATTN + 8 * c : ATTN + 8 * c + 8] for c in range(ATTN_CTAS)]
            a = [x for x in a if x[7] == 1]
            cb = [v[COMB + 4 * c : COMB + 4 * c + 4] for c in range((len(v) - COMB) // 4)]
            cb = [x for x in cb if x[3] == 1]
            rel = lambda t, t0=t0: (t - t0) / 1e3  # noqa: E731
            rows.append((a, cb, rel))
        a, cb, rel = rows[-1]
        stamps = sorted({x[0] for x in a} | {x[1] for x in a})
        diffs = [b - c for b, c in zip(stamps[1:], stamps[:-1], strict=True) if b != c]
        print(
            f"== B={B} H={H} T={T} prefix={P}: {len(a)} attention CTAs "
            f"(tiles {min_med_max([float(x[5]) for x in a])}), {len(cb)} combine CTAs; "
            f"min stamp step {min(diffs) if diffs else 0} ns",
            flush=True,
        )
        for name, k in (("entry", 0), ("meta", 1), ("tile0", 2), ("loop", 3), ("end", 4)):
            print(f"  attn {name:6s} min/med/max us {min_med_max([rel(x[k]) for x in a])}")
        # Per-CTA gaps between two stamps (columns of the attention record), in us.
        for label, later, earlier in (
            ("meta-entry", 1, 0),
            ("q-meta", 6, 1),
            ("tile0-meta", 2, 1),
            ("loop-tile0", 3, 2),
            ("end-loop", 4, 3),
        ):
            gaps = [(x[later] - x[earlier]) / 1e3 for x in a]
            print(f"  attn {label:11s} {min_med_max(gaps)}")
        for name, k in (("entry", 0), ("weights", 1), ("end", 2)):
            print(f"  comb {name:7s} min/med/max us {min_med_max([rel(x[k]) for x in cb])}")
        ends = [max([rel(x[2]) for x in c] + [rel(x[4]) for x in aa]) for aa, c, rel in rows]
        print(f"  last stamp per replay (us after marker): {[round(e, 2) for e in ends]}")


if __name__ == "__main__":
    main()
