"""Bit-for-bit comparison of two kernel builds: the outputs and LSEs of a fixed case list.

A change meant to keep the kernel's numbers (a schedule, a skipped no-op) is checked by saving
one build's outputs and comparing the other's, through ``bench/ab_kernels.sh`` on the GPU machine:

    bench/ab_kernels.sh prepare BASE_REF HEAD          # dev machine; carry "ab"
    bench/ab_kernels.sh with BASE python3 -m kdtree_verify._build
    bench/ab_kernels.sh with BASE python3 -m kdtree_bench.kernel.output_bits --save /tmp/base.pt
    bench/ab_kernels.sh with HEAD python3 -m kdtree_verify._build
    bench/ab_kernels.sh with HEAD python3 -m kdtree_bench.kernel.output_bits --against /tmp/base.pt

Every case runs in each numerics a pool supports (bf16: the kernel; fp8: ``fp16`` and
``triton``). Exit 1 when any output or LSE differs in a single bit (each difference printed with
its largest absolute value), 2 on a case list that does not match the saved one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from kdtree_verify import verify_attention
from kdtree_verify.testing import make_case

FP8 = torch.float8_e4m3fn
# (prefix lengths, draft tokens, heads, make_case options): ragged batches, split tails, causal
# and tree masks, the shapes the fp8 benchmarks time (B=8, H=8, T=8, 32k; the rank's 16 heads).
CASES: list[tuple[tuple[int, ...], int, int, dict]] = [
    ((4097, 0, 65, 1), 7, 12, {}),
    ((20000,), 16, 16, {"mask": "chain"}),
    ((300, 5), 64, 128, {}),
    ((4097, 0, 65, 1), 7, 12, {"kv_dtype": FP8, "k_scale": 0.75, "v_scale": 1.25}),
    ((20000,), 16, 16, {"kv_dtype": FP8, "mask": "chain", "strided_v": False}),
    ((1, 63, 64, 65), 13, 8, {"kv_dtype": FP8, "index_dtype": torch.int32}),
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
    for prefix_lens, draft, heads, options in CASES:
        case = make_case(
            prefix_lens, draft, heads, dtype=torch.bfloat16, device="cuda", seed=1, **options
        )
        fp8 = options.get("kv_dtype") == FP8
        for numerics in ("fp16", "triton") if fp8 else ("bf16",):
            kwargs = {"fp8_numerics": numerics} if fp8 else {}
            out, lse = verify_attention(*case.args(), return_lse=True, **case.scales(), **kwargs)
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
