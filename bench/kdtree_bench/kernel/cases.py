"""Fixed kernel cases, shared by the sanitizer run (``tests/gpu/kernel_sanitize_cases.py``) and
the bit comparison of two builds (``output_bits.py``).

Ragged prefixes (0 and 1 included), prefix-free batches, a split tail, the separate-V path, int32
indices, causal and tree masks, the multi-split combine, and an fp8 KV pool: register-staged
rows, ragged, a split tail, the draft block. Each is ``(prefix lengths, draft tokens, heads,
make_case options)``.
"""

from __future__ import annotations

from typing import Any

import torch

FP8 = torch.float8_e4m3fn

Case = tuple[tuple[int, ...], int, int, dict[str, Any]]

EDGE_CASES: list[Case] = [
    ((0,), 1, 8, {}),
    ((0, 0, 0), 5, 16, {"mask": "causal"}),
    ((4097, 0, 65, 1), 7, 12, {}),
    ((1, 63, 64, 65), 13, 8, {"index_dtype": torch.int32, "strided_v": False}),
    ((20000,), 16, 16, {"mask": "chain"}),
    ((300, 5), 64, 128, {}),
    ((4097, 0, 65, 1), 7, 12, {"kv_dtype": FP8, "k_scale": 0.75, "v_scale": 1.25}),
    ((20000,), 16, 16, {"kv_dtype": FP8, "mask": "chain", "strided_v": False}),
    ((1, 63, 64, 65), 13, 8, {"kv_dtype": FP8, "index_dtype": torch.int32}),
]


def is_fp8(case: Case) -> bool:
    return case[3].get("kv_dtype") == FP8


def numerics_modes(case: Case) -> tuple[str, ...]:
    """The ``fp8_numerics`` a case runs in: an fp8 pool both (``triton`` adds the row-max pass);
    a bf16 pool has one, which the argument does not change."""
    return ("fp16", "triton") if is_fp8(case) else ("fp16",)
