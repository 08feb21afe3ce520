"""The comparison rules for two greedy generations of the same prompt.

For a pair (a, b) -- baseline vs candidate, or baseline vs its A/A twin -- this finds:

* exact match of ``output_ids``, the first divergence index and the common-prefix length;
* finish-reason and length differences;
* the class of the first divergence:
  - ``near_tie``: a's token is in b's top-k and b's token is in a's top-k (vLLM's
    ``check_logprobs_close`` rule) AND on each side the gap between its own choice and the other
    side's choice is at most ``epsilon`` nats. vLLM's rule alone lets a candidate through that
    puts the baseline's token 5 nats down as long as it is still 5th; the gap bound does not.
  - ``hard``: anything else, including one side stopping while the other continues, and a
    divergence at a position where either side reported no top-k;
* logprob drift: at every position both sides agree on (the common prefix, where both saw the
  same context) ``|logprob_a - logprob_b|`` of the chosen token. It moves with any numerics
  change long before a greedy choice flips. A position where the baseline reports no logprob
  (null or -inf) is left out; a candidate that leaves out a logprob the baseline reports gives
  no drift to measure and is a malformed answer instead (``missing_logprobs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kdtree_parity.generation import Generation

DivergenceClass = Literal["near_tie", "hard"]
# Servers compute logprobs in float32 from bf16 logits: a gap of exactly k logit steps arrives as
# k steps plus a few float32 ulps (0.25000006 for one step of 0.25). A gap within this of
# epsilon is at epsilon; the smallest logit step that matters is 1e3 times larger.
GAP_ROUNDING = 1e-4


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (an observed value, never an interpolation); 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class DriftStats:
    """Distribution of |logprob difference| over a set of agreeing positions (nats)."""

    count: int = 0
    max: float = 0.0
    p99: float = 0.0
    mean: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> DriftStats:
        if not values:
            return cls()
        return cls(
            count=len(values),
            max=max(values),
            p99=percentile(values, 99),
            mean=sum(values) / len(values),
        )


@dataclass(frozen=True)
class PairComparison:
    """Everything the gate and the report need about one prompt on one pair of targets."""

    exact: bool
    common_prefix_len: int
    first_divergence: int | None
    divergence_class: DivergenceClass | None
    divergence_reason: str
    len_a: int
    len_b: int
    finish_a: str | None
    finish_b: str | None
    token_a: int | None = None  # the tokens chosen at the first divergence (None: ended)
    token_b: int | None = None
    gap_a: float | None = None  # a's logprob(own token) - logprob(b's token), when both known
    gap_b: float | None = None
    drift_values: tuple[float, ...] = field(default_factory=tuple)

    @property
    def length_differs(self) -> bool:
        return self.len_a != self.len_b

    @property
    def finish_differs(self) -> bool:
        return self.finish_a != self.finish_b

    @property
    def finish_mismatch(self) -> bool:
        """The same tokens, another finish reason: the finish-reason rule's count."""
        return self.exact and self.finish_differs

    @property
    def drift(self) -> DriftStats:
        return DriftStats.of(self.drift_values)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["drift_values"] = list(self.drift_values)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairComparison:
        return cls(**{**data, "drift_values": tuple(data["drift_values"])})


def _finite(logprob: float | None) -> bool:
    return logprob is not None and math.isfinite(logprob)


def _drift(a: Generation, b: Generation, upto: int) -> tuple[float, ...]:
    values = []
    for i in range(upto):
        la, lb = a.token_logprobs[i], b.token_logprobs[i]
        if _finite(la) and _finite(lb):
            values.append(abs(la - lb))
    return tuple(values)


def missing_logprobs(reference: Generation, answer: Generation) -> str | None:
    """Why ``answer`` is malformed next to ``reference`` (the baseline), or None: at a position
    where the reference reports its chosen token's logprob, the answer's is null, -inf or NaN
    (past the reference's end: wherever the reference reported any logprob at all). Such an
    answer would take its positions out of the drift rule, so it is an error, not a pass."""
    reports_any = any(_finite(lp) for lp in reference.token_logprobs)
    missing = [
        i
        for i, lp in enumerate(answer.token_logprobs)
        if not _finite(lp)
        and (
            _finite(reference.token_logprobs[i])
            if i < len(reference.token_logprobs)
            else reports_any
        )
    ]
    if not missing:
        return None
    return (
        f"{len(missing)} of {len(answer.token_logprobs)} chosen-token logprobs are missing "
        f"(null, -inf or NaN) where the baseline reports them, first at position {missing[0]}"
    )


def classify_divergence(
    a: Generation, b: Generation, position: int, epsilon: float
) -> tuple[DivergenceClass, str, float | None, float | None]:
    """Class of a divergence at ``position`` where both sides produced a (different) token."""
    token_a, token_b = a.output_ids[position], b.output_ids[position]
    top_a, top_b = a.top_map(position), b.top_map(position)
    if top_a is None or top_b is None:
        return "hard", "no top-k logprobs reported at the divergence", None, None
    own_a = top_a.get(token_a, a.token_logprobs[position])
    own_b = top_b.get(token_b, b.token_logprobs[position])
    gap_a = own_a - top_a[token_b] if token_b in top_a else None
    gap_b = own_b - top_b[token_a] if token_a in top_b else None
    if gap_a is None and gap_b is None:
        return "hard", "neither side's token is in the other's top-k", None, None
    if gap_a is None:
        return "hard", f"token {token_b} is not in the first side's top-k", None, gap_b
    if gap_b is None:
        return "hard", f"token {token_a} is not in the second side's top-k", gap_a, None
    worst = max(gap_a, gap_b)
    if worst <= epsilon + GAP_ROUNDING:
        return "near_tie", f"both tokens in both top-k, gaps {gap_a:.4g}/{gap_b:.4g}", gap_a, gap_b
    return (
        "hard",
        f"both tokens in both top-k but a gap of {worst:.4g} nats exceeds {epsilon:g}",
        gap_a,
        gap_b,
    )


def compare_generations(a: Generation, b: Generation, epsilon: float) -> PairComparison:
    """Apply every rule to one prompt's two generations."""
    shorter = min(len(a.output_ids), len(b.output_ids))
    prefix = 0
    while prefix < shorter and a.output_ids[prefix] == b.output_ids[prefix]:
        prefix += 1
    common = {
        "common_prefix_len": prefix,
        "len_a": len(a.output_ids),
        "len_b": len(b.output_ids),
        "finish_a": a.finish_reason,
        "finish_b": b.finish_reason,
        "drift_values": _drift(a, b, prefix),
    }
    if prefix == len(a.output_ids) == len(b.output_ids):
        reason = "" if a.finish_reason == b.finish_reason else "same tokens, finish reasons differ"
        return PairComparison(
            exact=True,
            first_divergence=None,
            divergence_class=None,
            divergence_reason=reason,
            **common,
        )
    if prefix == shorter:
        ended = "first" if len(a.output_ids) == shorter else "second"
        return PairComparison(
            exact=False,
            first_divergence=prefix,
            divergence_class="hard",
            divergence_reason=f"the {ended} side stopped at {shorter} tokens, the other went on",
            token_a=a.output_ids[prefix] if prefix < len(a.output_ids) else None,
            token_b=b.output_ids[prefix] if prefix < len(b.output_ids) else None,
            **common,
        )
    klass, reason, gap_a, gap_b = classify_divergence(a, b, prefix, epsilon)
    return PairComparison(
        exact=False,
        first_divergence=prefix,
        divergence_class=klass,
        divergence_reason=reason,
        token_a=a.output_ids[prefix],
        token_b=b.output_ids[prefix],
        gap_a=gap_a,
        gap_b=gap_b,
        **common,
    )
