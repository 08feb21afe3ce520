"""The gate policy: how to replay, how to compare, and the thresholds of the verdict (YAML).

A policy file has three sections; every key is optional, and a key left out takes its value
from the shipped ``default`` policy (``policies/default.yaml`` is the one source of defaults;
``kdtree-parity policy --show PATH`` prints what a file amounts to). Loading is strict, because
a policy that reads differently from what it says weakens the gate silently: unknown keys, a key
given twice, a value of the wrong type (``true`` or ``'20'`` for a count, ``'no'`` for a flag)
and non-finite numbers (``.inf``, ``.nan``) are refused, each with the YAML line it comes from.
Two policies ship as package data: ``default`` (real models, the default corpus) and ``short``
(the CPU reference engine with the short corpus). A policy argument is a path or one of those.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kdtree_parity.yaml_load import MappingNode, Node, YAMLError, compose_yaml, load_yaml

BUILTIN_POLICIES = ("default", "short")


def builtin_policy_path(name: str) -> Path:
    """Filesystem path of a shipped policy (``default`` or ``short``)."""
    if name not in BUILTIN_POLICIES:
        raise PolicyError(name, [(0, f"unknown built-in policy; choose {BUILTIN_POLICIES}")])
    return Path(str(resources.files("kdtree_parity") / "policies" / f"{name}.yaml"))


# Every key's default is its value in the shipped default policy, which sets every key.
_DEFAULTS: dict[str, dict[str, Any]] = load_yaml(
    builtin_policy_path("default").read_text(encoding="utf-8")
)


def _default(section: str, key: str) -> Any:
    return _DEFAULTS[section][key]


class PolicyError(ValueError):
    """A policy that cannot be used; ``problems`` holds (line number, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[int, str]]) -> None:
        self.source = source
        self.problems = problems
        if len(problems) == 1:
            ((line, message),) = problems
            super().__init__(f"policy {source}:{line}: {message}")
            return
        lines = "\n".join(f"  {source}:{line}: {message}" for line, message in problems)
        super().__init__(f"policy {source} has {len(problems)} problems:\n{lines}")


class _Strict(BaseModel):
    # strict: no coercion (true is not 1, '20' is not 20, 'no' is not false); finite numbers only.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ReplaySettings(_Strict):
    """How the corpus is sent to every target."""

    max_new_tokens: int = Field(
        _default("replay", "max_new_tokens"),
        ge=1,
        le=32768,
        description="per prompt unless the corpus entry sets its own `max_new_tokens`",
    )
    top_logprobs_num: int = Field(
        _default("replay", "top_logprobs_num"),
        ge=1,
        le=100,
        description="top-k logprobs asked for at every generated position",
    )
    concurrency: int = Field(
        _default("replay", "concurrency"), ge=1, le=256, description="requests in flight per target"
    )
    targets_in_turn: bool = Field(
        _default("replay", "targets_in_turn"),
        description="one request in flight in the whole run, never two targets at once: for targets "
        "that share a GPU, whose decode rates (the speed rule's) would otherwise measure their "
        "contention; the replay then takes about as many times longer as there are targets",
    )
    timeout_s: float = Field(
        _default("replay", "timeout_s"), gt=0, description="per-request timeout, seconds"
    )
    retries: int = Field(
        _default("replay", "retries"),
        ge=0,
        le=20,
        description="extra attempts, only after a connect error, HTTP 429, 502 or 503 (a load balancer's "
        "answers) or (`retry_on_timeout`; greedy is idempotent) a timeout",
    )
    backoff_s: float = Field(
        _default("replay", "backoff_s"),
        ge=0,
        le=60,
        description="first retry delay, seconds; doubles every retry, and a `Retry-After` (seconds or a "
        "date) is waited out (at most 60)",
    )
    max_retry_delay_s: float = Field(
        _default("replay", "max_retry_delay_s"),
        ge=0,
        le=300,
        description="no retry waits longer, neither the doubled backoff nor a `Retry-After` (at most 300: "
        "one answer can never stall a run for good). After the last retry a 503 counts as "
        "unavailable, a 429 or 502 as the candidate's HTTP error",
    )
    retry_on_timeout: bool = Field(
        _default("replay", "retry_on_timeout"),
        description="greedy /generate is idempotent, so a timed-out request is retried",
    )
    health_deadline_s: float = Field(
        _default("replay", "health_deadline_s"),
        gt=0,
        description="wait this long for every target's `/health`, seconds",
    )
    max_consecutive_transport_errors: int = Field(
        _default("replay", "max_consecutive_transport_errors"),
        ge=1,
        description="a target failing this many requests in a row ends the run (error)",
    )


class CompareSettings(_Strict):
    """How two generations of one prompt are compared."""

    near_tie_epsilon: float = Field(
        _default("compare", "near_tie_epsilon"),
        ge=0,
        description="a first divergence is a near-tie when each side's token is in the other's "
        "top-k and each side's logprob gap between the two tokens is at most this (nats)",
    )


class GateSettings(_Strict):
    """Thresholds of the verdict. Candidate figures are judged by their excess over A/A."""

    min_prompts: int = Field(
        _default("gate", "min_prompts"),
        ge=1,
        description="prompts compared without error on every target, else undecided",
    )
    max_hard_divergences: int = Field(
        _default("gate", "max_hard_divergences"),
        ge=0,
        description="candidate hard divergences minus the floor's (A/A' when the run has one, else A/A)",
    )
    min_exact_match_rate: float = Field(
        _default("gate", "min_exact_match_rate"),
        ge=0,
        le=1,
        description="candidate vs baseline, whole outputs identical",
    )
    max_excess_divergence_rate: float = Field(
        _default("gate", "max_excess_divergence_rate"),
        ge=0,
        le=1,
        description="candidate divergence rate minus the floor's: must be shown within it (interval, "
        "see Statistics)",
    )
    max_logprob_drift_p99: float = Field(
        _default("gate", "max_logprob_drift_p99"),
        ge=0,
        description="candidate p99 |logprob diff| at agreeing positions minus the floor's, nats: must be "
        "shown within it; also the margin of the tail and per-prompt maxima tests (see "
        "Statistics); drift measured at no position is never a pass (see verdict precedence)",
    )
    max_floor_drift_p99: float = Field(
        _default("gate", "max_floor_drift_p99"),
        ge=0,
        description="the A/A' floor's own p99 drift against the baseline may be at most this "
        "(nats); beyond it, or with any hard divergence of the floor, the floor is not an "
        'equivalent computation and the run is undecided (see "The reference targets are '
        'checked")',
    )
    max_finish_mismatches: int = Field(
        _default("gate", "max_finish_mismatches"),
        ge=0,
        description="prompts with the baseline's tokens but another finish reason, minus A/A's",
    )
    max_candidate_errors: int = Field(
        _default("gate", "max_candidate_errors"),
        ge=0,
        description='candidate answers that were HTTP errors or malformed (see "Malformed answers")',
    )
    allow_aa_divergence: bool = Field(
        _default("gate", "allow_aa_divergence"),
        description="if false, any A/A difference makes the run undecidable",
    )
    alpha: float = Field(
        _default("gate", "alpha"),
        gt=0,
        lt=1,
        description="false-fail rate of the statistical tests together, each at alpha over their number "
        "(Bonferroni): a candidate as good as the floor failing, or one beyond a margin shown "
        "within it; 0 < alpha < 1",
    )
    max_slowdown: float | None = Field(
        _default("gate", "max_slowdown"),
        ge=0,
        lt=1,
        description="the candidate's median decode rate (the sidecar's clock) must be shown at most this "
        "fraction below the baseline's; the twin's ratio only says whether the timing is too "
        "noisy to judge (null: no speed rule)",
    )
    # The one key whose omission does not take the shipped default's value: a policy written for
    # a short corpus (the CPU engine, a quick check) stays usable; the shipped default asks for
    # the deployment's context and says so.
    min_context_tokens: int = Field(
        0,
        ge=0,
        description="the longest prompt, in the baseline's tokens, the corpus must reach; a run "
        "that does not is undecided (0: no requirement; left out of a file: 0, not the "
        '`default` policy\'s value; see "Context-length buckets and coverage")',
    )
    max_accept_length_drop: float | None = Field(
        _default("gate", "max_accept_length_drop"),
        ge=0,
        lt=1,
        description="the candidate's mean accept length (tokens per speculative verify step) may "
        "be at most this fraction below the baseline's (never an A/A' floor's, which may draft "
        "another shape), overall and in every length bucket (null: not judged)",
    )


class Policy(_Strict):
    """A whole policy file."""

    replay: ReplaySettings = Field(default_factory=ReplaySettings)
    compare: CompareSettings = Field(default_factory=CompareSettings)
    gate: GateSettings = Field(default_factory=GateSettings)


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy with its source text (stored with every run) and the text's sha256."""

    policy: Policy
    source: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def _line_of(node: Node | None, loc: tuple[Any, ...]) -> int:
    """The 1-based YAML line of the value at ``loc`` (or of its nearest existing parent)."""
    line = node.start_mark.line + 1 if node is not None else 1
    for key in loc:
        if not isinstance(node, MappingNode):
            break
        for key_node, value_node in node.value:
            if key_node.value == key:
                node = value_node
                line = key_node.start_mark.line + 1
                break
        else:
            break
    return line


def parse_policy(text: str, source: str = "<policy>") -> LoadedPolicy:
    """Validate policy YAML; raises PolicyError with line numbers."""
    try:
        root = compose_yaml(text)
        data = load_yaml(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise PolicyError(
            source, [(line, f"invalid YAML: {getattr(exc, 'problem', exc)}")]
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(source, [(1, "a policy is a YAML mapping with replay/compare/gate")])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            where = ".".join(str(p) for p in loc) or "(top level)"
            problems.append((_line_of(root, loc), f"{where}: {err['msg']}"))
        raise PolicyError(source, sorted(problems)) from None
    return LoadedPolicy(policy=policy, source=source, text=text)


def load_policy(spec: str | Path) -> LoadedPolicy:
    """Load a policy from a path, or a shipped one by name (a path wins if it exists)."""
    path = Path(spec)
    if not path.exists() and str(spec) in BUILTIN_POLICIES:
        path = builtin_policy_path(str(spec))
    if not path.is_file():
        raise PolicyError(str(spec), [(0, "no such file (and not a built-in policy name)")])
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PolicyError(str(path), [(line, f"not valid UTF-8: {exc.reason}")]) from None
    return parse_policy(text, source=str(path))


def policy_yaml(policy: Policy) -> str:
    """The effective policy, every key included, as YAML (``kdtree-parity policy --show``)."""
    return yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False)
