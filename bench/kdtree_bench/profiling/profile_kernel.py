"""One verify attention call at one shape, for Nsight Compute (ncu) to profile.

    ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        python3 -m kdtree_bench.profiling.profile_kernel --batch 1 --heads 8 --draft 8 --prefix 32768

Two warm-up calls come first (skip them with --launch-skip 2), then the profiled one.
``--kv-dtype fp8`` puts the prefix in an e4m3 pool (scales 0.5 / 0.25) and rounds per
``--fp8-numerics``: with ``triton`` each call launches the row-max pass before the attention
kernel (regex ``plan_kernel|attention_kernel|combine_kernel`` names every launch of one call).
"""

from __future__ import annotations

import argparse

import torch

from kdtree_verify import verify_attention
from kdtree_verify.testing import make_case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--draft", type=int, default=8)
    parser.add_argument("--prefix", type=int, default=32768)
    parser.add_argument("--mask", choices=("tree", "chain", "causal"), default="tree")
    parser.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    parser.add_argument("--fp8-numerics", choices=("fp16", "triton"), default="triton")
    args = parser.parse_args()
    fp8 = args.kv_dtype == "fp8"
    case = make_case(
        [args.prefix] * args.batch,
        args.draft,
        args.heads,
        mask=args.mask,
        dtype=torch.bfloat16,
        device="cuda",
        kv_dtype=torch.float8_e4m3fn if fp8 else None,
        k_scale=0.5 if fp8 else 1.0,
        v_scale=0.25 if fp8 else 1.0,
    )
    numerics = {"fp8_numerics": args.fp8_numerics} if fp8 else {}
    for _ in range(3):
        out = verify_attention(*case.args(), **case.scales(), **numerics)
    torch.cuda.synchronize()
    print(
        f"B={args.batch} H={args.heads} T={args.draft} prefix={args.prefix} "
        f"kv {args.kv_dtype}{' ' + args.fp8_numerics if fp8 else ''}: out {tuple(out.shape)}"
    )


if __name__ == "__main__":
    main()
