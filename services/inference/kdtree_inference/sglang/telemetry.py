"""Prometheus metrics and the structured publish log line of the kdtree verify backend.

The metrics live in the scheduler processes, where the backend runs. With SGLang's
``--enable-metrics`` the launcher sets ``PROMETHEUS_MULTIPROC_DIR`` before spawning them, so
``prometheus_client`` (imported here lazily, after that variable exists) writes every value to the
shared directory and SGLang's own ``/metrics`` endpoint, which aggregates that directory, exposes
them next to SGLang's. Without it they stay in the process's default registry.

Metrics (every one labelled ``tp_rank``):

=============================================== ======= =========================================
name                                            type    meaning
=============================================== ======= =========================================
kdtree_verify_mode{mode}                        gauge   1 for the active KDTREE_VERIFY mode
kdtree_verify_steps_total                       counter target-verify forwards seen
kdtree_verify_graph_replays_total               counter of those, CUDA-graph replays (the rest
                                                        ran eagerly)
kdtree_verify_kernel_calls_total                counter layer calls the kdtree kernel computed
kdtree_verify_fallbacks_total{reason}           counter verify layer calls left to Triton, by why
kdtree_verify_max_abs_error{layer}              gauge   max |kernel - triton| in the last window
kdtree_verify_max_rel_error{layer}              gauge   max |kernel - triton| / (|triton| + atol')
kdtree_verify_over_tolerance_total{layer}       counter output elements over tolerance: |kernel -
                                                        triton| > atol' + rtol * |triton|
kdtree_verify_compared_elements_total           counter output elements compared
kdtree_verify_publishes_total                   counter comparison windows published
kdtree_verify_shadow_errors_total               counter on mode: runs of KDTREE_SHADOW_ERROR_STREAK
                                                        windows over tolerance
kdtree_verify_max_abs_error_vs_exact{side,      gauge   validate, fp8 pool: max |side - exact| in
layer}                                                  the last window, side triton or kdtree,
                                                        exact the kernel's fp16-operand mode
=============================================== ======= =========================================

atol' is atol scaled per latent dimension, atol * max(1, largest |value| of that dimension in the
KV pool and the step's new rows), in the SGLang backend (``comparison``), and atol itself in the
reference engine's validate.

EAGLE's draft-extend forward, when the kernel serves it too (``KDTREE_DRAFT_EXTEND``), reports
the same metrics under the prefix ``kdtree_draft_extend_`` instead of ``kdtree_verify_`` (its
"steps" are draft-extend forwards), so the two never mix.

One log line per publish, on logger ``kdtree.verify``: ``kdtree_verify_publish {json}`` (or
``kdtree_draft_extend_publish``).
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .comparison import LayerStats
from .modes import Role, VerifyMode, VerifySettings

logger = logging.getLogger("kdtree.verify")

PUBLISH_EVENT = "kdtree_verify_publish"
INVALID_INPUTS = "invalid_inputs"
"""The fallback reason of a call whose inputs the op rejected (an alert of its own)."""


@dataclass
class _Metrics:
    mode: Any
    steps: Any
    graph_replays: Any
    kernel_calls: Any
    fallbacks: Any
    max_abs: Any
    max_rel: Any
    over_tolerance: Any
    compared: Any
    publishes: Any
    shadow_errors: Any
    error_vs_exact: Any


# Keyed by the registry object itself (weakly): an id() could be reused by a later registry.
_METRICS_BY_REGISTRY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _metrics(registry: Any | None, prefix: str = "kdtree_verify") -> _Metrics:
    """The metric objects of ``registry`` (default: prometheus_client's) under ``prefix``,
    created once."""
    from prometheus_client import REGISTRY, Counter, Gauge

    registry = REGISTRY if registry is None else registry
    by_prefix = _METRICS_BY_REGISTRY.setdefault(registry, {})
    found = by_prefix.get(prefix)
    if found is not None:
        return found
    rank = ["tp_rank"]
    forward = "Target-verify" if prefix == Role.TARGET_VERIFY.metric_prefix else "Draft-extend"
    made = _Metrics(
        mode=Gauge(
            f"{prefix}_mode",
            "1 for the active KDTREE_VERIFY mode of this scheduler",
            ["mode", *rank],
            registry=registry,
            multiprocess_mode="livemax",
        ),
        steps=Counter(f"{prefix}_steps", f"{forward} forwards seen", rank, registry=registry),
        graph_replays=Counter(
            f"{prefix}_graph_replays",
            f"{forward} forwards that were CUDA-graph replays",
            rank,
            registry=registry,
        ),
        kernel_calls=Counter(
            f"{prefix}_kernel_calls",
            f"{forward} layer calls computed by the kdtree kernel",
            rank,
            registry=registry,
        ),
        fallbacks=Counter(
            f"{prefix}_fallbacks",
            f"{forward} layer calls left to SGLang's Triton kernel, by reason",
            ["reason", *rank],
            registry=registry,
        ),
        max_abs=Gauge(
            f"{prefix}_max_abs_error",
            "Max |kernel - triton| over the last published window",
            ["layer", *rank],
            registry=registry,
            multiprocess_mode="mostrecent",
        ),
        max_rel=Gauge(
            f"{prefix}_max_rel_error",
            "Max |kernel - triton| / (|triton| + atol) over the last published window (the "
            "SGLang backend's atol is times max(1, the largest |value|) per latent dimension)",
            ["layer", *rank],
            registry=registry,
            multiprocess_mode="mostrecent",
        ),
        over_tolerance=Counter(
            f"{prefix}_over_tolerance",
            "Output elements where |kernel - triton| > atol + rtol * |triton| (the SGLang "
            "backend's atol is times max(1, the largest |value|) per latent dimension)",
            ["layer", *rank],
            registry=registry,
        ),
        compared=Counter(
            f"{prefix}_compared_elements",
            "Output elements compared between the kernel and Triton",
            rank,
            registry=registry,
        ),
        publishes=Counter(
            f"{prefix}_publishes", "Comparison windows published", rank, registry=registry
        ),
        shadow_errors=Counter(
            f"{prefix}_shadow_errors",
            "On mode: runs of consecutive published windows over tolerance",
            rank,
            registry=registry,
        ),
        error_vs_exact=Gauge(
            f"{prefix}_max_abs_error_vs_exact",
            "fp8 pool: max |side - exact| over the last published window (exact: the kernel's "
            "fp16-operand mode on the same stored values)",
            ["side", "layer", *rank],
            registry=registry,
            multiprocess_mode="mostrecent",
        ),
    )
    by_prefix[prefix] = made
    return made


@dataclass(frozen=True)
class PublishSummary:
    """What one publish reported (also the payload of its log line)."""

    step: int
    mode: str
    layers: int
    compared: int
    over_tolerance: int
    max_abs: float
    max_rel: float
    worst_layer: int | None
    over_streak: int
    shadow_error: bool


class VerifyTelemetry:
    """The backend's reporting: counters as things happen, comparison windows when published."""

    def __init__(
        self,
        settings: VerifySettings,
        tp_rank: int = 0,
        registry: Any | None = None,
        role: Role = Role.TARGET_VERIFY,
    ):
        self.settings = settings
        self.rank = str(tp_rank)
        self.prefix = Role(role).metric_prefix  # a str is accepted, and refused unless a role
        self._metrics = m = _metrics(registry, self.prefix)
        self._over_streak = 0
        for mode in VerifyMode:
            m.mode.labels(mode=mode.value, tp_rank=self.rank).set(1 if mode is settings.mode else 0)
        # The counters every serving step touches, bound once: resolving labels takes a lock and
        # a lookup each time (several µs under SGLang's multiprocess metrics).
        self._steps = m.steps.labels(tp_rank=self.rank)
        self._graph_replays = m.graph_replays.labels(tp_rank=self.rank)
        self._kernel_calls = m.kernel_calls.labels(tp_rank=self.rank)
        self._fallbacks: dict[str, Any] = {}
        # What the alert rules watch for increases exists at 0 from the start: Prometheus sees
        # no increase in a counter whose first sample is already above 0
        # (deploy/monitoring/kdtree-alerts.yml).
        m.shadow_errors.labels(tp_rank=self.rank)
        self._fallbacks[INVALID_INPUTS] = m.fallbacks.labels(
            reason=INVALID_INPUTS, tp_rank=self.rank
        )

    def verify_steps(self, count: int = 1, graph_replay: bool = False) -> None:
        self._steps.inc(count)
        if graph_replay:
            self._graph_replays.inc(count)

    def kernel_calls(self, count: int = 1) -> None:
        if count:
            self._kernel_calls.inc(count)

    def fallbacks(self, reason: str, count: int = 1) -> None:
        if count:
            child = self._fallbacks.get(reason)
            if child is None:
                child = self._fallbacks[reason] = self._metrics.fallbacks.labels(
                    reason=reason, tp_rank=self.rank
                )
            child.inc(count)

    def publish_vs_exact(self, step: int, sides: dict[str, Iterable[LayerStats]]) -> dict | None:
        """Report each side's error against the exact computation (an fp8 pool in validate
        mode): a gauge per side and layer, and one log line with each side's worst layer."""
        worst: dict[str, float] = {}
        for side, stats in sides.items():
            for s in stats:
                if not s.compared:
                    continue
                layer = str(s.layer_id)
                self._metrics.error_vs_exact.labels(side=side, layer=layer, tp_rank=self.rank).set(
                    s.max_abs
                )
                worst[side] = max(worst.get(side, 0.0), s.max_abs)
        if not worst:
            return None
        summary = {"step": step, "max_abs_vs_exact": worst}
        closer = min(worst, key=worst.get)
        logger.info(
            "%s_vs_exact %s (closer to exact: %s)", self.prefix, json.dumps(summary), closer
        )
        return summary

    def publish(self, step: int, stats: Iterable[LayerStats]) -> PublishSummary | None:
        """Report one comparison window; returns None (and reports nothing) if nothing compared."""
        stats = [s for s in stats if s.compared > 0]
        if not stats:
            return None
        m = self._metrics
        for s in stats:
            layer = str(s.layer_id)
            m.max_abs.labels(layer=layer, tp_rank=self.rank).set(s.max_abs)
            m.max_rel.labels(layer=layer, tp_rank=self.rank).set(s.max_rel)
            # Created at 0 by the first window that compares the layer (see __init__).
            over_tolerance = m.over_tolerance.labels(layer=layer, tp_rank=self.rank)
            if s.over_tolerance:
                over_tolerance.inc(s.over_tolerance)
        compared = sum(s.compared for s in stats)
        over = sum(s.over_tolerance for s in stats)
        m.compared.labels(tp_rank=self.rank).inc(compared)
        m.publishes.labels(tp_rank=self.rank).inc()
        # NaN must win the "worst" comparison: it is the worst thing a kernel can produce.
        worst = max(stats, key=lambda s: float("inf") if s.max_abs != s.max_abs else s.max_abs)

        self._over_streak = self._over_streak + 1 if over else 0
        shadow_error = (
            self.settings.mode is VerifyMode.ON
            and self._over_streak > 0
            and self._over_streak % self.settings.shadow_error_streak == 0
        )
        if shadow_error:
            m.shadow_errors.labels(tp_rank=self.rank).inc()
        summary = PublishSummary(
            step=step,
            mode=self.settings.mode.value,
            layers=len(stats),
            compared=compared,
            over_tolerance=over,
            max_abs=worst.max_abs,
            max_rel=max(s.max_rel for s in stats),
            worst_layer=worst.layer_id,
            over_streak=self._over_streak,
            shadow_error=shadow_error,
        )
        line = f"{self.prefix}_publish {json.dumps(summary.__dict__, allow_nan=True)}"
        if shadow_error:
            logger.error(
                "%s; the kdtree kernel disagreed with Triton beyond tolerance in %d consecutive "
                "windows (atol=%s times max(1, the largest |value|) per latent dimension, "
                "rtol=%g)",
                line,
                self._over_streak,
                self.settings.atol,
                self.settings.rtol,
            )
        elif over:
            logger.warning(line)
        else:
            logger.info(line)
        return summary
