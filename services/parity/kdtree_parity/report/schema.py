"""The JSON report's schema, as pydantic models (``kdtree-parity schema`` prints it as JSON Schema).

Stable for machines: fields are only ever added; a breaking change bumps ``SCHEMA_VERSION``.
Logprobs are natural-log probabilities; ``null`` where a target reported none (or -inf).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from kdtree_parity.policy import Policy

SCHEMA_VERSION = 1


class TopLogprobModel(BaseModel):
    token_id: int
    logprob: float | None
    text: str | None = None


class SideModel(BaseModel):
    """One target's answer for one prompt."""

    role: Literal["baseline", "candidate", "aa", "floor"]
    output_ids: list[int] = Field(description="greedy output token ids (empty on error)")
    token_texts: list[str | None] = Field(description="per token text, when the target sent it")
    token_logprobs: list[float | None]
    finish_reason: str | None
    text: str
    error: str | None = Field(description="'<kind>: <message>' when the request failed")
    attempts: int
    elapsed_s: float
    decode_tps: float | None = Field(None, description="decode tokens/s of this request")
    ttft_s: float | None = Field(None, description="time to first token, when reported")
    prompt_tokens: int | None = Field(
        None, description="the prompt's length in this target's tokens (meta_info.prompt_tokens)"
    )
    spec_verify_ct: int | None = Field(
        None, description="speculative verify forwards for this answer (meta_info.spec_verify_ct)"
    )
    accept_length: float | None = Field(
        None, description="completion_tokens / spec_verify_ct, when the target reports them"
    )
    top_at_divergence: list[TopLogprobModel] | None = Field(
        None, description="this side's top-k at the candidate pair's first divergence"
    )


class DriftModel(BaseModel):
    """|logprob difference| of the chosen token at agreeing positions (nats)."""

    count: int
    max: float
    p99: float = Field(description="nearest-rank 99th percentile")
    mean: float


class ComparisonModel(BaseModel):
    """One prompt on one pair: a = baseline, b = candidate (or the A/A twin)."""

    exact: bool
    common_prefix_len: int
    first_divergence: int | None
    divergence_class: Literal["near_tie", "hard"] | None
    divergence_reason: str
    len_a: int
    len_b: int
    finish_a: str | None
    finish_b: str | None
    token_a: int | None
    token_b: int | None
    gap_a: float | None = Field(description="a: logprob(a's token) - logprob(b's token)")
    gap_b: float | None = Field(description="b: logprob(b's token) - logprob(a's token)")
    drift: DriftModel

    @field_validator("gap_a", "gap_b", mode="before")
    @classmethod
    def _finite_or_null(cls, gap: float | None) -> float | None:
        """JSON has no infinities: a gap against a token the other side never ranked is null."""
        return None if gap is None or not math.isfinite(gap) else gap


class PromptModel(BaseModel):
    id: str
    bucket: str | None = Field(None, description="context-length bucket (buckets.py)")
    line: int = Field(description="line of the entry in the corpus file")
    tags: list[str]
    prompt: str = Field(description="the prompt text (or its input_ids), cut at 4000 chars")
    status: Literal["exact", "near_tie", "hard", "error"] = Field(
        description="candidate vs baseline: the class of the first divergence, or error"
    )
    candidate: ComparisonModel | None
    aa: ComparisonModel | None
    floor: ComparisonModel | None = None
    sides: list[SideModel]


class PairSummaryModel(BaseModel):
    compared: int
    exact: int
    exact_rate: float
    diverged: int
    divergence_rate: float
    hard: int
    near_tie: int
    length_differs: int
    finish_differs: int
    finish_mismatch: int = Field(
        description="prompts with identical tokens but another finish reason (the finish rule)"
    )
    divergence_positions: list[int]
    hard_prompt_ids: list[str]
    finish_mismatch_prompt_ids: list[str]
    drift: DriftModel


class ExcessModel(BaseModel):
    """Candidate figures minus the A/A figures: what the gate judges."""

    divergence_rate: float
    hard: int
    drift_p99: float
    finish_mismatch: int


class UndecidablePromptModel(BaseModel):
    """A prompt the baseline rejected (an HTTP error answer): it cannot decide anything."""

    id: str
    why: str = Field(description="every target's error on it")


class SummaryModel(BaseModel):
    prompts_total: int
    prompts_done: int = Field(description="prompts with a stored result (errored included)")
    prompts_compared: int = Field(description="prompts where every request succeeded")
    errors: dict[str, dict[str, int]] = Field(
        description="role -> error kind -> count, over the prompts that are not undecidable"
    )
    candidate: PairSummaryModel
    aa: PairSummaryModel
    excess: ExcessModel
    undecidable_prompts: list[UndecidablePromptModel] = Field(
        default_factory=list,
        description="prompts the baseline rejected too; their errors count against no target",
    )
    floor: PairSummaryModel | None = Field(
        None,
        description="baseline vs the A/A' target, when the run has one: the noise floor the "
        "excess is measured over (otherwise the exact A/A twin is)",
    )
    speed: list[RoleSpeedModel] = Field(default_factory=list)


class TestModel(BaseModel):
    """A statistical test behind a rule (drift, divergence count, speed)."""

    name: str
    method: str
    statistic: float | None = Field(
        description="the excess (drift p99, divergence rate), the count above the threshold "
        "(exceedances, prompt maxima), the median ratio (speed)"
    )
    p_value: float | None = Field(description="null for an interval-only test")
    alpha: float = Field(description="the level this test ran at (the policy alpha / tests)")
    decision: Literal["pass", "fail", "undecided"]
    estimate: float | None = Field(
        None, description="the effect: an excess over the floor, or the speed ratio"
    )
    interval: list[float] | None = Field(
        None,
        description="[low, high] bootstrap interval of the estimate at 1 - 2 alpha (each bound "
        "one-sided at alpha)",
    )
    power: str | None = Field(
        None, description="what the test could detect at this run's size (null: older reports)"
    )


class ReasonModel(BaseModel):
    rule: str
    outcome: Literal["pass", "fail", "undecided"]
    message: str
    test: TestModel | None = None


class RoleSpeedModel(BaseModel):
    """One target's measured speed over the compared prompts."""

    role: Literal["baseline", "candidate", "aa", "floor"]
    requests: int
    median_decode_tps: float | None = Field(
        description="median tokens/s per request by the sidecar's clock (output tokens over the "
        "request's end-to-end time): what the speed rule judges"
    )
    median_ttft_s: float | None = Field(
        description="median time to first token (null: the target does not report it)"
    )
    median_reported_decode_tps: float | None = Field(
        None,
        description="median decode tokens/s the target reports about itself (meta_info): shown, "
        "never used",
    )


class VerdictModel(BaseModel):
    status: Literal["pass", "fail", "error"] = Field(
        description="error = could not decide; a run that did not finish is never a pass"
    )
    reasons: list[ReasonModel]


class TargetModel(BaseModel):
    role: Literal["baseline", "candidate", "aa", "floor"]
    url: str
    identity: dict | None = Field(
        description="'image': the label given at the start (digest/reference), 'model_info': "
        "what the target's /model_info reported"
    )


class IdentityChangeModel(BaseModel):
    """A target whose identity changed when the run was resumed, accepted by explicit override."""

    role: Literal["baseline", "candidate", "aa", "floor"]
    at: str
    differences: list[str]
    before: dict | None = Field(description="the identity recorded before the change")


class RunModel(BaseModel):
    id: str
    status: Literal["running", "passed", "failed", "error", "interrupted"]
    pair: str
    created_at: str
    finished_at: str | None
    duration_s: float | None
    error: str | None


class CorpusModel(BaseModel):
    source: str
    sha256: str
    prompts: int


class PolicyModel(BaseModel):
    source: str
    sha256: str
    text: str
    settings: Policy | None = Field(
        description="the effective policy; null when today's policy rules refuse the stored text"
    )
    refused: str | None = Field(
        None,
        description="why today's policy rules refuse the stored text (a run's verdict "
        "then stands as it was stored)",
    )


class AcceptLengthModel(BaseModel):
    """One target's accept length (tokens per speculative verify step) over some prompts."""

    role: str
    answers: int = Field(description="answers that reported spec_verify_ct")
    mean: float


class BucketModel(BaseModel):
    """The gate's rules over one context-length bucket's prompts alone."""

    label: str = Field(description="short, 1k, 8k, 32k, 128k, 200k or unmeasured")
    prompts: int = Field(description="prompts answered without error in this bucket")
    min_tokens: int | None = Field(description="shortest prompt, in the targets' tokens")
    max_tokens: int | None = Field(description="longest prompt, in the targets' tokens")
    status: str = Field(description="the rules' verdict over this bucket alone")
    candidate: PairSummaryModel
    aa: PairSummaryModel
    floor: PairSummaryModel | None = None
    reasons: list[ReasonModel]
    accept_length: list[AcceptLengthModel] = Field(default_factory=list)


class ContextModel(BaseModel):
    """How far into long contexts the run looked, and what it found there."""

    longest_prompt_tokens: int | None = Field(
        description="the longest prompt the targets measured (meta_info.prompt_tokens)"
    )
    min_context_tokens: int = Field(description="what the policy requires (0: nothing)")
    accept_length: list[AcceptLengthModel] = Field(default_factory=list)
    buckets: list[BucketModel] = Field(default_factory=list)


class Report(BaseModel):
    """A parity run's report."""

    schema_version: int = SCHEMA_VERSION
    generated_at: str
    run: RunModel
    verdict: VerdictModel
    targets: list[TargetModel]
    corpus: CorpusModel
    policy: PolicyModel
    summary: SummaryModel
    prompts: list[PromptModel]
    identity_changes: list[IdentityChangeModel] = Field(
        default_factory=list,
        description="resumes that went on against a changed target (--accept-identity-change): "
        "results from more than one build are in this run",
    )
    context: ContextModel | None = Field(
        None,
        description="the rules by context-length bucket, the longest prompt reached and "
        "accept length (null when the stored policy is refused)",
    )
