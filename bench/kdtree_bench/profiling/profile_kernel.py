"""One verify attention call at one shape, for Nsight Compute (ncu) to profile.

    ncu --clock-control none --kernel-name regex:attention_kernel --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        python3 -m kdtree_bench.profiling.profile_kernel --batch 1 --heads 8 --draft 8 --prefix 32768

Two warm-up calls come first (skip them with --launch-skip 2), then the profiled one.
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
    args = parser.parse_args()
    case = make_case(
        [args.prefix] * args.batch,
        args.draft,
        args.heads,
        mask=args.mask,
        dtype=torch.bfloat16,
        device="cuda",
    )
    for _ in range(3):
        out = verify_attention(*case.args())
    torch.cuda.synchronize()
    print(
        f"B={args.batch} H={args.heads} T={args.draft} prefix={args.prefix}: out {tuple(out.shape)}"
    )


if __name__ == "__main__":
    main()
