"""Cases for ``compute-sanitizer --tool memcheck`` (not a pytest module: run under the sanitizer).

Covers ragged prefixes (including 0 and 1), prefix-free batches, a split tail, the separate-V
path, int32 indices, causal and tree masks, the multi-split combine, and an fp8 KV pool. Exits non-zero if any
output is non-finite; the sanitizer's own exit code reports memory errors.

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu/kernel_sanitize_cases.py [--fp8]
"""

from __future__ import annotations

import sys

import torch

from kdtree_verify import verify_attention
from kdtree_verify.testing import make_case

CASES = [
    ((0,), 1, 8, {}),
    ((0, 0, 0), 5, 16, {"mask": "causal"}),
    ((4097, 0, 65, 1), 7, 12, {}),
    ((1, 63, 64, 65), 13, 8, {"index_dtype": torch.int32, "strided_v": False}),
    ((20000,), 16, 16, {"mask": "chain"}),
    ((300, 5), 64, 128, {}),
    # fp8 (float8_e4m3fn) pool: register-staged rows, ragged, a split tail, the draft block
    ((4097, 0, 65, 1), 7, 12, {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.75, "v_scale": 1.25}),
    ((20000,), 16, 16, {"kv_dtype": torch.float8_e4m3fn, "mask": "chain", "strided_v": False}),
    ((1, 63, 64, 65), 13, 8, {"kv_dtype": torch.float8_e4m3fn, "index_dtype": torch.int32}),
]


def main(argv: list[str]) -> int:
    """All cases, or with ``--fp8`` only the fp8-pool ones."""
    fp8_only = "--fp8" in argv
    bad = 0
    for prefix_lens, num_draft, num_heads, kwargs in CASES:
        if fp8_only and "kv_dtype" not in kwargs:
            continue
        case = make_case(
            prefix_lens, num_draft, num_heads, dtype=torch.bfloat16, device="cuda", **kwargs
        )
        # An fp8 pool in both numerics modes (fp8_numerics="triton" adds the row-max pass).
        modes = ("fp16", "triton") if "kv_dtype" in kwargs else ("fp16",)
        for numerics in modes:
            out, lse = verify_attention(
                *case.args(), return_lse=True, fp8_numerics=numerics, **case.scales()
            )
            torch.cuda.synchronize()
            finite = bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
            print(
                f"{prefix_lens} T={num_draft} H={num_heads} {kwargs} {numerics}: finite={finite}",
                flush=True,
            )
            bad += not finite
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
