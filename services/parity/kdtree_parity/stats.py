"""The gate's statistical tests (scipy), each with its statistic, p-value and decision.

Three questions are asked of a run, each against the noise floor (the A/A' pair when the run has
an A/A' target, otherwise the exact A/A twin):

* logprob drift: are the candidate's per-position drifts stochastically larger than the floor's?
  One-sided Mann-Whitney U (``scipy.stats.mannwhitneyu``, alternative ``greater``);
* divergences: does the candidate diverge from the baseline on more prompts than the floor does?
  One-sided Fisher exact test on the 2x2 table diverged/exact x candidate/floor
  (``scipy.stats.fisher_exact``, alternative ``greater``);
* speed: the ratio of the candidate's median decode rate to the baseline's, with a paired
  bootstrap percentile interval (``scipy.stats.bootstrap``), next to the same ratio for the
  A/A twin (the timing noise of the run).

Each test runs at ``alpha / TESTS_PER_RUN`` (Bonferroni), so the policy's ``alpha`` bounds the
probability that a candidate as good as the floor fails any of them. A test alone never fails a
candidate on significance alone: the effect must also exceed the policy's margin (a drift excess,
a divergence-rate excess, a slowdown), because with hundreds of positions a real but harmless
difference is always significant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any, Literal

import numpy as np
from scipy import stats

# The tests a run's verdict makes at alpha / TESTS_PER_RUN each (drift, divergences, speed).
TESTS_PER_RUN = 3
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # a report is reproducible: the same run gives the same interval

TestDecision = Literal["pass", "fail", "undecided"]


@dataclass(frozen=True)
class TestResult:
    """One statistical test as the report prints it. ``interval`` is a confidence interval of
    ``estimate`` at level ``1 - alpha`` (None for tests that give a p-value only)."""

    name: str
    method: str
    statistic: float | None
    p_value: float | None
    alpha: float
    decision: TestDecision
    estimate: float | None = None
    interval: tuple[float, float] | None = None

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


def drift_greater(
    candidate: Sequence[float], floor: Sequence[float]
) -> tuple[float | None, float | None]:
    """Mann-Whitney U (one-sided: candidate drift greater) -> (U, p); (None, None) when either
    sample is empty. Identical samples (every drift 0 on both sides) give p = 1."""
    if not candidate or not floor:
        return None, None
    if max(candidate) == min(candidate) == max(floor) == min(floor):
        return float(len(candidate) * len(floor)) / 2.0, 1.0
    res = stats.mannwhitneyu(candidate, floor, alternative="greater", method="asymptotic")
    return float(res.statistic), float(res.pvalue)


def more_divergences(
    candidate_diverged: int, candidate_total: int, floor_diverged: int, floor_total: int
) -> tuple[float | None, float | None]:
    """Fisher exact (one-sided: the candidate diverges more often) -> (odds ratio, p)."""
    if candidate_total == 0 or floor_total == 0:
        return None, None
    table = [
        [candidate_diverged, candidate_total - candidate_diverged],
        [floor_diverged, floor_total - floor_diverged],
    ]
    res = stats.fisher_exact(table, alternative="greater")
    odds = float(res.statistic)
    return (odds if math.isfinite(odds) else None), float(res.pvalue)


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
