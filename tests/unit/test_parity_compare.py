"""Comparison rules on hand-written token and logprob sequences."""

from __future__ import annotations

import math

import pytest

from kdtree_parity.compare import DriftStats, compare_generations, percentile
from kdtree_parity.generation import Generation, TopLogprob


def gen(
    ids: list[int],
    logprobs: list[float] | None = None,
    tops: list[dict[int, float] | None] | None = None,
    finish: str | None = "length",
) -> Generation:
    """A generation whose top-k defaults to {own token: its logprob} at every position."""
    logprobs = logprobs if logprobs is not None else [-0.1] * len(ids)
    if tops is None:
        tops = [{t: lp} for t, lp in zip(ids, logprobs, strict=True)]
    return Generation(
        output_ids=tuple(ids),
        token_logprobs=tuple(logprobs),
        top_logprobs=tuple(
            None if top is None else tuple(TopLogprob(t, lp) for t, lp in top.items())
            for top in tops
        ),
        token_texts=tuple(None for _ in ids),
        finish_reason=finish,
    )


def test_identical_outputs_are_exact_with_zero_drift() -> None:
    a = gen([5, 6, 7], [-0.5, -0.2, -0.1])
    c = compare_generations(a, a, epsilon=0.1)
    assert c.exact and c.first_divergence is None and c.divergence_class is None
    assert c.common_prefix_len == 3 and not c.length_differs and not c.finish_differs
    assert c.drift_values == (0.0, 0.0, 0.0)


def test_same_tokens_different_logprobs_is_exact_but_drifts() -> None:
    a = gen([5, 6, 7], [-0.5, -0.2, -0.1])
    b = gen([5, 6, 7], [-0.5, -0.25, -0.4])
    c = compare_generations(a, b, epsilon=0.1)
    assert c.exact
    assert c.drift_values == pytest.approx((0.0, 0.05, 0.3))
    assert c.drift.max == pytest.approx(0.3)


def test_near_tie_when_both_tokens_in_both_top_k_within_epsilon() -> None:
    a = gen([1, 2, 3], [-0.1, -0.70, -0.1], [{1: -0.1}, {2: -0.70, 9: -0.72}, {3: -0.1}])
    b = gen([1, 9, 4], [-0.1, -0.69, -0.1], [{1: -0.1}, {9: -0.69, 2: -0.71}, {4: -0.1}])
    c = compare_generations(a, b, epsilon=0.05)
    assert not c.exact
    assert c.first_divergence == 1 and c.common_prefix_len == 1
    assert c.divergence_class == "near_tie"
    assert (c.token_a, c.token_b) == (2, 9)
    assert c.gap_a == pytest.approx(0.02) and c.gap_b == pytest.approx(0.02)
    # Drift is measured only where both saw the same context: position 0.
    assert c.drift_values == (0.0,)


def test_gap_beyond_epsilon_is_hard_even_when_in_top_k() -> None:
    # vLLM's rule alone would accept this: each token is in the other's top-k.
    a = gen([2], [-0.1], [{2: -0.1, 9: -3.0}])
    b = gen([9], [-0.2], [{9: -0.2, 2: -0.3}])
    c = compare_generations(a, b, epsilon=0.1)
    assert c.divergence_class == "hard"
    assert "exceeds" in c.divergence_reason
    assert c.gap_a == pytest.approx(2.9)


@pytest.mark.parametrize(
    ("gap", "klass"),
    [
        # One logit step of 0.25 as a server reports it (e2e 15's kimi-rank gate): float32
        # logprobs of bf16 logits put it a few ulps above the step.
        (-12.500000 - -12.750000596, "near_tie"),
        (0.25, "near_tie"),
        (0.2502, "hard"),
    ],
)
def test_a_gap_at_epsilon_up_to_float32_rounding_is_a_near_tie(gap: float, klass: str) -> None:
    a = gen([2], [-12.5], [{2: -12.5, 9: -12.5 - gap}])
    b = gen([9], [-12.5], [{9: -12.5, 2: -12.5 - 0.25}])
    assert compare_generations(a, b, epsilon=0.25).divergence_class == klass


def test_token_missing_from_other_top_k_is_hard() -> None:
    a = gen([2], [-0.1], [{2: -0.1, 3: -2.0}])
    b = gen([9], [-0.1], [{9: -0.1, 2: -0.12}])
    c = compare_generations(a, b, epsilon=0.5)
    assert c.divergence_class == "hard"
    assert "not in the first side's top-k" in c.divergence_reason
    assert c.gap_a is None and c.gap_b == pytest.approx(0.02)


def test_neither_token_in_other_top_k_is_hard() -> None:
    c = compare_generations(gen([2]), gen([9]), epsilon=10.0)
    assert c.divergence_class == "hard"
    assert "neither" in c.divergence_reason


def test_missing_top_k_at_divergence_is_hard() -> None:
    a = gen([2], [-0.1], [None])
    b = gen([9], [-0.1], [{9: -0.1, 2: -0.1}])
    c = compare_generations(a, b, epsilon=1.0)
    assert c.divergence_class == "hard" and "no top-k" in c.divergence_reason


def test_one_side_stopping_early_is_a_hard_length_divergence() -> None:
    a = gen([1, 2, 3, 4], finish="length")
    b = gen([1, 2], finish="stop")
    c = compare_generations(a, b, epsilon=1.0)
    assert not c.exact and c.divergence_class == "hard"
    assert c.first_divergence == 2 and c.common_prefix_len == 2
    assert c.length_differs and c.finish_differs
    assert c.token_a == 3 and c.token_b is None
    assert "second side stopped" in c.divergence_reason


def test_same_tokens_different_finish_reason_is_exact_but_flagged() -> None:
    c = compare_generations(gen([1, 2], finish="stop"), gen([1, 2], finish="length"), 0.1)
    assert c.exact and c.finish_differs and "finish reasons differ" in c.divergence_reason


def test_divergence_at_first_token() -> None:
    a = gen([7, 1], [-0.3, -0.1], [{7: -0.3, 8: -0.31}, {1: -0.1}])
    b = gen([8, 1], [-0.3, -0.1], [{8: -0.3, 7: -0.32}, {1: -0.1}])
    c = compare_generations(a, b, epsilon=0.05)
    assert c.first_divergence == 0 and c.divergence_class == "near_tie"
    assert c.drift_values == ()


def test_infinite_logprobs_are_left_out_of_drift() -> None:
    a = gen([1, 2], [-math.inf, -0.1])
    b = gen([1, 2], [-0.5, -0.3])
    assert compare_generations(a, b, 0.1).drift_values == pytest.approx((0.2,))


def test_comparison_round_trips_through_json() -> None:
    from kdtree_parity.compare import PairComparison

    c = compare_generations(gen([1, 2, 3]), gen([1, 5, 3]), 0.1)
    assert PairComparison.from_json(c.to_json()) == c


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 99) == 0.0
    assert percentile([3.0], 99) == 3.0
    values = [float(i) for i in range(1, 101)]  # 1..100
    assert percentile(values, 99) == 99.0
    assert percentile(values, 50) == 50.0
    assert percentile(values[:10], 99) == 10.0
    stats = DriftStats.of([0.0, 0.1, 0.2, 0.7])
    assert stats.count == 4 and stats.max == 0.7 and stats.p99 == 0.7
    assert stats.mean == pytest.approx(0.25)


def test_nan_logprobs_are_left_out_of_drift() -> None:
    a = gen([1, 2], [math.nan, -0.1])
    b = gen([1, 2], [-0.5, -0.3])
    assert compare_generations(a, b, 0.1).drift_values == pytest.approx((0.2,))


@pytest.mark.parametrize("hidden", [None, -math.inf, math.nan], ids=["null", "-inf", "nan"])
def test_an_answer_missing_logprobs_the_baseline_reports_is_named(hidden: float | None) -> None:
    from kdtree_parity.compare import missing_logprobs

    baseline = gen([1, 2, 3], [-0.1, -0.2, -0.3])
    answer = gen([1, 2, 3], [-0.1, hidden, hidden])
    assert missing_logprobs(baseline, answer) == (
        "2 of 3 chosen-token logprobs are missing (null, -inf or NaN) where the baseline "
        "reports them, first at position 1"
    )
    # Past the baseline's end: missing wherever the baseline reported any logprob at all.
    assert "first at position 3" in missing_logprobs(
        baseline, gen([1, 2, 3, 4], [-0.1] * 3 + [hidden])
    )
    # Where the baseline reports none itself, leaving it out is no fault.
    silent = gen([1, 2, 3], [-math.inf] * 3)
    assert missing_logprobs(silent, gen([1, 2, 3], [-math.inf] * 3)) is None
    assert missing_logprobs(baseline, baseline) is None


def test_same_tokens_other_finish_reason_is_a_finish_mismatch_a_length_change_is_not() -> None:
    same = compare_generations(gen([1, 2], finish="length"), gen([1, 2], finish="abort"), 0.1)
    assert same.finish_mismatch
    shorter = compare_generations(gen([1, 2, 3], finish="length"), gen([1, 2], finish="stop"), 0.1)
    assert shorter.finish_differs and not shorter.finish_mismatch  # a hard divergence already
