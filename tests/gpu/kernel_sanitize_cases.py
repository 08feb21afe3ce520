"""``kdtree_bench.kernel.cases.EDGE_CASES`` for ``compute-sanitizer`` (not a pytest module: run
under the sanitizer), every fp8 case in both numerics. Exits non-zero if any output is
non-finite; the sanitizer's own exit code reports memory errors.

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu/kernel_sanitize_cases.py [--fp8]
"""

from __future__ import annotations

import sys

import torch

from kdtree_bench.kernel.cases import EDGE_CASES, is_fp8, numerics_modes
from kdtree_verify import verify_attention
from kdtree_verify.testing import make_case


def main(argv: list[str]) -> int:
    """All cases, or with ``--fp8`` only the fp8-pool ones."""
    fp8_only = "--fp8" in argv
    bad = 0
    for spec in EDGE_CASES:
        if fp8_only and not is_fp8(spec):
            continue
        prefix_lens, num_draft, num_heads, kwargs = spec
        case = make_case(
            prefix_lens, num_draft, num_heads, dtype=torch.bfloat16, device="cuda", **kwargs
        )
        for numerics in numerics_modes(spec):
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
