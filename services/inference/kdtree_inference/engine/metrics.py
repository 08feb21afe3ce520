"""Prometheus metrics of one engine process (a private registry, served at GET /metrics).

With the ``validate`` backend the engine also reports its op-vs-baseline comparison under the
SGLang backend's names (``kdtree_verify_*``: mode, steps, kernel calls, per-layer max errors,
elements over tolerance and compared, publishes; ``sglang.telemetry``), one window per verify
step, so the alert rules and dashboard written for SGLang servers work on it unchanged.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..sglang.comparison import LayerStats
from ..sglang.modes import VerifyMode, VerifySettings
from ..sglang.telemetry import VerifyTelemetry


class EngineMetrics:
    def __init__(self, attention: str, tolerance: tuple[float, float] = (0.02, 0.02)) -> None:
        self.registry = CollectorRegistry()
        labels = ["attention"]
        self.attention = attention
        self.requests = Counter(
            "kdtree_engine_requests",
            "HTTP requests to /generate, /v1/completions and /v1/chat/completions, by response status",
            [*labels, "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "kdtree_engine_prompt_tokens", "Prompt tokens prefilled", labels, registry=self.registry
        )
        self.generation_tokens = Counter(
            "kdtree_engine_generation_tokens",
            "Output tokens generated",
            labels,
            registry=self.registry,
        )
        self.verify_steps = Counter(
            "kdtree_engine_spec_verify_steps",
            "Verify forwards per request (draft tree checks)",
            labels,
            registry=self.registry,
        )
        self.drafts_proposed = Counter(
            "kdtree_engine_spec_draft_tokens_proposed",
            "Draft tokens proposed (tree minus root)",
            labels,
            registry=self.registry,
        )
        self.drafts_accepted = Counter(
            "kdtree_engine_spec_draft_tokens_accepted",
            "Draft tokens accepted by verification",
            labels,
            registry=self.registry,
        )
        self.latency = Histogram(
            "kdtree_engine_request_latency_seconds",
            "End-to-end latency of finished requests",
            labels,
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.aborted = Counter(
            "kdtree_engine_aborted_requests",
            "Requests aborted because their client went away",
            labels,
            registry=self.registry,
        )
        self.ready = Gauge("kdtree_engine_ready", "1 once warm", labels, registry=self.registry)
        self.validate_calls = Gauge(
            "kdtree_engine_validate_calls",
            "validate mode: attention calls compared (op vs baseline)",
            labels,
            registry=self.registry,
        )
        self.validate_max_abs_diff = Gauge(
            "kdtree_engine_validate_max_abs_diff",
            "validate mode: largest |op - baseline| of any attention output element so far",
            labels,
            registry=self.registry,
        )
        self.running = Gauge(
            "kdtree_engine_running_requests",
            "Requests being decoded",
            labels,
            registry=self.registry,
        )

        self.verify: VerifyTelemetry | None = None
        self._verify_steps = 0
        if attention == "validate":
            atol, rtol = tolerance
            settings = VerifySettings(mode=VerifyMode.VALIDATE, atol=atol, rtol=rtol)
            self.verify = VerifyTelemetry(settings, registry=self.registry)

    def publish_validation(self, window: list[LayerStats], calls: int) -> None:
        """validate: one verify step's comparison window and the op calls it made."""
        if self.verify is None:
            return
        self._verify_steps += 1
        self.verify.verify_steps()
        self.verify.kernel_calls(calls)
        self.verify.publish(self._verify_steps, window)

    def on_verify_step(self, attention: str, proposed: int, accepted: int, emitted: int) -> None:
        self.verify_steps.labels(attention).inc()
        self.drafts_proposed.labels(attention).inc(proposed)
        self.drafts_accepted.labels(attention).inc(accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
