"""Configuration of the embedded reference engine: the model's shape and the server's limits.

Every knob has a default that gives the documented tiny model; the CLI (``__main__``) and the
environment (``KDTREE_ENGINE_*``, ``KDTREE_VERIFY``: ``kdtree_inference.settings``) override them.
``EngineConfig`` is validated by pydantic and refuses in the settings dialect
(``kdtree_settings``): one line per bad field, naming it and what it expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, assert_never

from kdtree_settings import refusal_text
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    InstanceOf,
    ValidationError,
    model_validator,
)
from pydantic._internal._model_construction import ModelMetaclass

from kdtree_verify import QK_DIM, ROPE_DIM, V_DIM

from ..faults import Fault
from ..settings import InferenceSettings, VerifyMode

# The MLA geometry is DeepSeek-V3's and is fixed: the verify op is specialised to it.
KV_LORA_RANK = V_DIM  # latent (compressed KV) width = v head dim seen by attention
QK_ROPE_HEAD_DIM = ROPE_DIM  # decoupled rope part of every key and query
QK_HEAD_DIM_ABSORBED = QK_DIM  # latent + rope

ATTENTION_BACKENDS = ("reference", "op", "triton", "validate")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the tiny DeepSeek-V3-like decoder (absorbed MLA, SwiGLU MLP, RMSNorm)."""

    vocab_size: int = 259  # 256 bytes + BOS + EOS + PAD (see tokenizer.py)
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 8
    qk_nope_head_dim: int = 64  # per-head "nope" query width before absorption into the latent
    v_head_dim: int = 64  # per-head output width after the latent is up-projected
    q_lora_rank: int = 192
    intermediate_size: int = 512
    rope_theta: float = 10000.0
    max_position: int = 4096
    rms_norm_eps: float = 1e-6
    # Logit scale: the seeded weights are multiplied so the greedy top-1 / top-2 gap is usually
    # well away from a tie (python -m kdtree_inference.engine.margins prints the distribution).
    logit_scale: float = 6.0
    seed: int = 0

    @property
    def sm_scale(self) -> float:
        # DeepSeek-V3 scales by the *unabsorbed* query width (nope + rope), not by 576.
        return (self.qk_nope_head_dim + QK_ROPE_HEAD_DIM) ** -0.5


@dataclass(frozen=True)
class SpecConfig:
    """Shape of the draft tree proposed at every decode step.

    ``num_draft_tokens`` counts the tree's root (the last committed token, whose KV is not yet in
    the pool) like SGLang's ``speculative_num_draft_tokens``; 1 means plain decoding.
    """

    num_draft_tokens: int = 8
    topk: int = 2  # children per node the drafter may branch into
    max_depth: int = 6
    ngram_max: int = 3  # longest suffix the prompt-lookup drafter tries to match
    ngram_min: int = 1

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.topk < 1 or self.max_depth < 1:
            raise ValueError("topk and max_depth must be >= 1")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")


class EngineConfigError(ValueError):
    """An engine configuration that cannot run: one line per bad field, in the settings
    dialect (``field=value: expected ...``)."""


class _FieldDefaults(ModelMetaclass):
    """``EngineConfig.max_batch_size`` is the field's default, as it was for the dataclass (the
    CLI's flags take their defaults from there)."""

    def __getattr__(cls, name: str) -> Any:
        fields = cls.__dict__.get("__pydantic_fields__") or {}
        if name in fields and not fields[name].is_required():
            return fields[name].get_default(call_default_factory=True)
        return super().__getattr__(name)


class EngineConfig(BaseModel, metaclass=_FieldDefaults):
    """Everything the scheduler and the HTTP layer need besides the model weights.

    Validated by pydantic in the settings dialect (``kdtree_settings``): a bad value is refused
    with :class:`EngineConfigError` (a ValueError) naming each field and what it expects.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    model: InstanceOf[ModelConfig] = Field(default_factory=ModelConfig)
    spec: InstanceOf[SpecConfig] = Field(default_factory=SpecConfig)
    attention: Literal[ATTENTION_BACKENDS] = "reference"  # type: ignore[valid-type]
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    kv_pool_size: int = 32768  # KV slots per layer (one per token, shared by all requests)
    max_batch_size: int = 16  # requests decoded together in one verify forward
    # prompt tokens per prefill forward (each an extend over the last)
    prefill_chunk: int = Field(64, ge=1)
    max_prompt_tokens: int = 2048
    max_new_tokens_limit: int = 1024
    max_batch_request: int = 64  # prompts in one batched /generate call
    model_path: str = "kdtree-tiny-mla"
    weights_dir: str | None = None
    fault_layer: int | None = None
    fault_scale: float = 1.0
    # TEST ONLY: a graded fault from KDTREE_INJECT_FAULT (kdtree_inference.faults); None = stock.
    injected_fault: InstanceOf[Fault] | None = None
    # Stream events carry only what is new since the previous one (SGLang's
    # --incremental-streaming-output); False resends the whole output each time, SGLang's default.
    incremental_streaming_output: bool = True
    warmup_delay_s: float = 0.0
    # Equivalent numerics (the parity gate's A/A' floor): the reference backend reduces every
    # request's keys in this many chunks merged by log-sum-exp (split_kv.py). 1: one pass.
    attention_kv_splits: int = Field(1, ge=1)
    # TEST/BENCHMARK ONLY: sleep this long after every decode step, a candidate made slow on
    # purpose for the parity gate's speed rule. Off (0) by default.
    decode_step_delay_s: float = Field(0.0, ge=0)
    # validate: an element is over tolerance when not |op - baseline| <= atol + rtol * |baseline|
    # (KDTREE_VERIFY_ATOL / _RTOL, the SGLang backend's rule and defaults).
    validate_atol: float = 0.02
    validate_rtol: float = 0.02
    # Bearer token every route but /health* and /metrics requires (SGLang's --api-key); never
    # shown in the config's repr.
    api_key: str | None = Field(None, repr=False)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            text = refusal_text(error, type(self).model_fields, lambda name: name)
            raise EngineConfigError(text) from None

    @model_validator(mode="after")
    def _consistent(self) -> EngineConfig:
        if self.fault_layer is not None and not 0 <= self.fault_layer < self.model.num_layers:
            raise ValueError(
                f"fault layer {self.fault_layer} out of range [0, {self.model.num_layers})"
            )
        fault = self.injected_fault
        if fault is not None and fault.kind == "weight" and fault.layer >= self.model.num_layers:
            raise ValueError(
                f"KDTREE_INJECT_FAULT: weight layer {fault.layer} out of range "
                f"[0, {self.model.num_layers})"
            )
        if (
            fault is not None
            and fault.kind == "tree_mask"
            and fault.index >= self.spec.num_draft_tokens
        ):
            # A row past the tree changes nothing: a "fault" every candidate would pass with.
            raise ValueError(
                f"KDTREE_INJECT_FAULT: tree_mask row {fault.index} is past the tree's "
                f"{self.spec.num_draft_tokens} rows [0, {self.spec.num_draft_tokens})"
            )
        if self.attention_kv_splits > 1 and self.attention != "reference":
            raise ValueError("attention_kv_splits > 1 needs the reference attention backend")
        return self


def default_attention_backend(device: str, mode: VerifyMode | str | None = None) -> str:
    """The backend KDTREE_VERIFY selects, with the SGLang backend's meaning.

    off -> the baseline (plain torch reference on CPU, SGLang's Triton kernel on GPU);
    on -> our verify op; validate -> both, serving the baseline's output and recording the largest
    difference (as the SGLang backend's validate mode does). ``mode``: a mode, KDTREE_VERIFY's
    spelling of one, or None for the environment's.
    """
    if not isinstance(mode, VerifyMode):
        env = None if mode is None else {"KDTREE_VERIFY": mode}
        mode = InferenceSettings.from_env(env).verify
    match mode:
        case VerifyMode.OFF:
            return baseline_backend(device)
        case VerifyMode.ON:
            return "op"
        case VerifyMode.VALIDATE:
            return "validate"
        case _:
            assert_never(mode)


def baseline_backend(device: str) -> str:
    """What KDTREE_VERIFY=off serves: SGLang's Triton kernel on GPU, the torch reference on CPU."""
    return "triton" if device.startswith("cuda") else "reference"
