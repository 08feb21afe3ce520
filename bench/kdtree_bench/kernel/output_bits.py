"""Bit-for-bit comparison of two kernel builds: the outputs and LSEs of a fixed case list.

A change meant to keep the kernel's numbers (a schedule, a skipped no-op) is checked by saving
one build's outputs and comparing the other's, through ``bench/ab_kernels.sh`` on the GPU machine:

    bench/ab_kernels.sh prepare BASE_REF HEAD          # dev machine; carry "ab"
    bench/ab_kernels.sh with BASE python3 -m kdtree_verify._build
    bench/ab_kernels.sh with BASE python3 -m kdtree_bench.kernel.output_bits --save /tmp/base.pt
    bench/ab_kernels.sh with HEAD python3 -m kdtree_verify._build
    bench/ab_kernels.sh with HEAD python3 -m kdtree_bench.kernel.output_bits --against /tmp/base.pt

Every case runs in each numerics its pool supports (``cases.numerics_modes``: an fp8 pool's
``fp16`` and ``triton``; a bf16 pool's one, named ``fp16``). Exit 1 when any output or LSE
differs in a single bit (each difference printed with its largest absolute value), 2 on a case
list that does not match the saved one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from kdtree_bench.kernel.cases import EDGE_CASES, FP8, Case, numerics_modes
from kdtree_verify import verify_attention
from kdtree_verify.testing import make_case

# The sanitizer's edge cases, then the shapes the fp8 benchmarks time (B=8, H=8, T=8, 32k; the
# rank's 16 heads and DFlash's block at 1k and 128k).
CASES: list[Case] = [
    *EDGE_CASES,
    ((1024,), 16, 16, {"kv_dtype": FP8, "mask": "causal", "k_scale": 0.5, "v_scale": 0.25}),
    ((32768,) * 8, 8, 8, {"kv_dtype": FP8, "k_scale": 0.5, "v_scale": 0.25}),
    ((131072,), 16, 16, {"kv_dtype": FP8, "mask": "causal", "k_scale": 0.5, "v_scale": 0.25}),
]


def case_name(prefix_lens: tuple[int, ...], draft: int, heads: int, options: dict) -> str:
    lens = (
        ",".join(map(str, prefix_lens))
        if len(prefix_lens) < 5
        else f"{prefix_lens[0]}x{len(prefix_lens)}"
    )
    extra = " ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in sorted(options.items()))
    return f"[{lens}] T={draft} H={heads} {extra}".strip()


def run_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every case's (out, lse), copied to the host, keyed by case and numerics."""
    results = {}
    for spec in CASES:
        prefix_lens, draft, heads, options = spec
        case = make_case(
            prefix_lens, draft, heads, dtype=torch.bfloat16, device="cuda", seed=1, **options
        )
        for numerics in numerics_modes(spec):
            out, lse = verify_attention(
                *case.args(), return_lse=True, fp8_numerics=numerics, **case.scales()
            )
            torch.cuda.synchronize()
            name = f"{case_name(prefix_lens, draft, heads, options)} {numerics}"
            results[name] = (out.cpu(), lse.cpu())
    return results


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal in every bit (NaNs included), unlike ``torch.equal`` on values."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def compare(saved: dict, current: dict) -> int:
    """Print one line per case; 0 when every tensor is bit-identical."""
    if saved.keys() != current.keys():
        print(f"case lists differ: saved {sorted(saved)}, now {sorted(current)}", file=sys.stderr)
        return 2
    differing = 0
    for name, (out, lse) in current.items():
        base_out, base_lse = saved[name]
        if _same_bits(out, base_out) and _same_bits(lse, base_lse):
            print(f"identical  {name}")
            continue
        differing += 1
        out_diff = (out.float() - base_out.float()).abs().max().item()
        lse_diff = (lse - base_lse).abs().max().item()
        print(
            f"DIFFERENT  {name}: max |out - base| {out_diff:.3g}, max |lse - base| {lse_diff:.3g}"
        )
    print(f"{len(current) - differing} of {len(current)} identical")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", type=Path, help="write this build's outputs here")
    mode.add_argument("--against", type=Path, help="compare this build's outputs with a saved file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    results = run_cases()
    if args.save:
        torch.save(results, args.save)
        print(f"saved {len(results)} outputs to {args.save}")
        return 0
    return compare(torch.load(args.against), results)


if __name__ == "__main__":
    sys.exit(main())
