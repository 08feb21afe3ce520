"""The statistics the gate's rules share (scipy): the test record, the per-test level, and the
paired bootstrap interval of a median ratio.

The rules themselves (``noninferiority.py``) are five tests per run -- the p99 drift excess, the
drift exceedances per position, the per-prompt drift maxima, the divergence-rate excess and the
speed ratio -- each at ``alpha / TESTS_PER_RUN`` (Bonferroni). So the policy's ``alpha`` bounds
both error rates of a run: the chance that a candidate as good as the floor fails any test, and
the chance that a candidate beyond a margin is shown within it (each interval bound is one-sided
at the per-test level).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any, Literal

import numpy as np
from scipy import stats

# The tests a run's verdict makes at alpha / TESTS_PER_RUN each: drift p99, drift exceedances,
# per-prompt drift maxima, divergences, speed (``noninferiority.py``).
TESTS_PER_RUN = 5
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # a report is reproducible: the same run gives the same interval

TestDecision = Literal["pass", "fail", "undecided"]


@dataclass(frozen=True)
class TestResult:
    """One statistical test as the report prints it. ``interval`` is a confidence interval of
    ``estimate`` at level ``1 - 2 * alpha``, each bound one-sided at ``alpha`` (None for tests
    that give a p-value only); ``power`` says what the test could detect at this run's size."""

    name: str
    method: str
    statistic: float | None
    p_value: float | None
    alpha: float
    decision: TestDecision
    estimate: float | None = None
    interval: tuple[float, float] | None = None
    power: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval"] = None if self.interval is None else list(self.interval)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestResult:
        interval = data.get("interval")
        return cls(**{**data, "interval": None if interval is None else tuple(interval)})


def per_test_alpha(alpha: float) -> float:
    """The level each test runs at so that the run's false-fail rate is at most ``alpha``."""
    return alpha / TESTS_PER_RUN


def median_ratio(
    candidate: Sequence[float], baseline: Sequence[float], alpha: float
) -> tuple[float, tuple[float, float]] | None:
    """median(candidate) / median(baseline) with a bootstrap percentile interval at level
    ``1 - alpha``. The samples are paired (the same prompts, in the same order) and resampled
    as pairs. A single pair has no spread to resample: its interval is the point itself. None
    when the samples are empty or the baseline's median is not positive."""
    if len(candidate) != len(baseline):
        raise ValueError(f"paired samples of {len(candidate)} and {len(baseline)} values")
    if not candidate or median(baseline) <= 0:
        return None
    estimate = median(candidate) / median(baseline)

    def ratio(c: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(c, axis=axis) / np.maximum(np.median(b, axis=axis), 1e-300)

    if len(candidate) == 1 or (len(set(candidate)) == 1 and len(set(baseline)) == 1):
        return estimate, (estimate, estimate)
    res = stats.bootstrap(
        (np.asarray(candidate, dtype=float), np.asarray(baseline, dtype=float)),
        ratio,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=1 - alpha,
        method="percentile",
        paired=True,
        vectorized=True,
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return estimate, (low, high)
