"""A deterministic prompt corpus for the engine's own tools (margins, GPU parity, demo)."""

from __future__ import annotations

import random

_SEEDS = [
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time, in a land far away, there lived a",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "1, 1, 2, 3, 5, 8, 13, 21, 34,",
    "To be, or not to be, that is the question:",
    "<html><body><h1>Hello</h1><p>world</p></body></html>",
    "Speculative decoding drafts tokens and verifies them in one forward pass.",
    "The mitochondria is the powerhouse of the cell. The mitochondria",
    "abc abc abc abc abd abd abd",
    '{"name": "kdtree", "version": "0.1.0", "tags": ["mla", "verify"]}',
    "In 1969, Apollo 11 landed on the Moon. In 1969,",
]


def prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` prompts: the seed texts first, then seeded splices of them (varied lengths)."""
    rng = random.Random(seed)
    out = list(_SEEDS[:count])
    while len(out) < count:
        a, b = rng.sample(_SEEDS, 2)
        cut_a = rng.randrange(8, len(a))
        cut_b = rng.randrange(0, len(b) // 2)
        out.append(f"{a[:cut_a]} {b[cut_b:]}"[: rng.randrange(12, 120)])
    return out
