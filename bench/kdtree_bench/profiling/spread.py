"""A timing's median with its spread, as every profiling tool here reports it."""

from __future__ import annotations

import statistics
from typing import Any


def median_spread(values: list[float], digits: int) -> dict[str, Any]:
    """``median``, ``min``, ``max`` and every ``run`` of ``values``, rounded to ``digits``."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "runs": [round(v, digits) for v in values],
    }
