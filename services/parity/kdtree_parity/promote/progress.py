"""Progress lines on stderr, so stdout stays the one-line result a script can read."""

from __future__ import annotations

import sys


def step(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)
