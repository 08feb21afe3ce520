"""The inference package's settings: every ``KDTREE_*`` variable its programs read, in one model.

The SGLang backend (``sglang.modes.VerifySettings``), ``kdtree-serve`` and the reference engine
(``kdtree-engine``) read them from here; README.md's configuration table is generated from the
fields' descriptions (``scripts/config_table.py``). The model speaks the shared dialect
(``kdtree_settings.EnvSettings``): a variable that is unset, empty or blank takes its default; bad
values are refused with :class:`SettingsError`, one line per variable, each naming it.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import kdtree_settings
from kdtree_settings import EnvSettings, on_off
from pydantic import BeforeValidator, Field, SecretStr, Strict
from pydantic_settings import SettingsConfigDict

from kdtree_verify.validation import FP8_NUMERICS

from .faults import Fault, parse_fault

ENV_PREFIX = "KDTREE_"


class VerifyMode(enum.Enum):
    """``KDTREE_VERIFY``: which attention serves the verify forward."""

    OFF = "off"
    VALIDATE = "validate"
    ON = "on"


class SettingsError(kdtree_settings.SettingsError):
    """``KDTREE_*`` variables hold values the programs cannot use; the message names each."""


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _fault(value: Any) -> Any:
    return parse_fault(value) if isinstance(value, str) else value


Word = BeforeValidator(_lower)
Switch = Annotated[bool, Strict(), BeforeValidator(on_off)]


class InferenceSettings(EnvSettings):
    """The SGLang backend's, ``kdtree-serve``'s and the reference engine's ``KDTREE_*`` settings."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")
    error_type: ClassVar[type[kdtree_settings.SettingsError]] = SettingsError

    verify: Annotated[VerifyMode, Word] = Field(
        VerifyMode.OFF,
        description="verify path: `off` (stock), `validate` (both, serve stock, measure) or `on` "
        "(serve the kernel); the reference engine: `off` serves its baseline (torch reference on "
        "CPU, SGLang's Triton kernel on GPU), `on` the verify op, `validate` both",
    )
    validate_every: int = Field(
        100, ge=1, description="publish the kernel-vs-Triton statistics every N verify steps"
    )
    shadow_every: int = Field(
        0,
        ge=0,
        description="`on`: also run SGLang's kernel and compare on every Nth verify step "
        "(0 = never)",
    )
    verify_atol: float | None = Field(
        None,
        ge=0.0,
        description="an element is over tolerance when not |kernel − triton| <= atol·max(1, s) "
        "+ rtol·|triton|, s the largest |value| of the element's latent dimension in the KV pool "
        "and the step's new rows (the SGLang backend: rounding one attention weight moves the "
        "output by that rounding times a value; the engine's validate takes atol as is); unset: "
        "by the KV pool, `0.02` bf16, `0.125` fp8 (one e4m3 step of an attention weight, "
        "docs/kernel-fp8.md)",
    )
    verify_rtol: float = Field(
        0.02, ge=0.0, description="the relative part of that tolerance (see `KDTREE_VERIFY_ATOL`)"
    )
    shadow_error_streak: int = Field(
        3,
        ge=1,
        description="`on`: consecutive windows over tolerance that log an error and count a "
        "shadow error",
    )
    draft_extend: Switch = Field(
        True,
        description="`on`: EAGLE's draft extend follows `KDTREE_VERIFY` too; `off`: it stays on "
        "Triton",
    )
    fp8_numerics: Annotated[Literal[FP8_NUMERICS], Word] = Field(  # type: ignore[valid-type]
        "triton",
        description="FP8 KV cache: `triton` rounds q and P to e4m3 as SGLang's Triton path does "
        "(parity with stock); `fp16` keeps them in fp16, closer to the exact result "
        "([docs/kernel-fp8.md](docs/kernel-fp8.md))",
    )
    inject_fault: Annotated[Fault | None, BeforeValidator(_fault)] = Field(
        None,
        description="TEST ONLY: a graded fault (`scale:S`, `kv_drop:P`, `tree_mask:R`; the "
        "reference engine also `weight:L:S[:SEED]`), for measuring the parity gate's resolution "
        "([docs/parity.md](docs/parity.md#resolution-graded-faults)); the SGLang backend needs "
        "`KDTREE_VERIFY=on`; logged as a warning at start (the engine also shows it in "
        "`/model_info`); a malformed value is refused (exit 2)",
    )
    ddtree_topk: int = Field(
        8,
        ge=1,
        description="`--speculative-algorithm DDTREE`: candidates per depth of the draft tree "
        "(its node budget is SGLang's `--speculative-num-draft-tokens` minus 1)",
    )
    ddtree_search: Annotated[Literal["torch", "triton"], Word] = Field(
        "triton",
        description="`--speculative-algorithm DDTREE`: how the draft tree is searched on the GPU, "
        "`triton` (the best-first heap as one kernel per request) or `torch` (each depth's "
        "candidates sorted, batched ops; ties broken otherwise); both replay as CUDA graphs",
    )
    sglang_launcher: str | None = Field(
        None,
        description="the command `kdtree-serve` execs (split like a shell), followed by its "
        "arguments; unset: `python -m sglang.launch_server` of this interpreter",
    )
    start_gate: Path | None = Field(
        None,
        description="a file: each SGLang scheduler process waits, after its imports and before "
        "its first CUDA call, until it exists, so that servers sharing a GPU can start together "
        "and still measure their memory in turn (the speed harness opens each gate once the "
        "server before holds its pools); unset: no wait",
    )
    start_gate_timeout_s: float = Field(
        900.0,
        gt=0,
        description="seconds a scheduler waits for `KDTREE_START_GATE` before it starts anyway",
    )
    engine_weights: str | None = Field(
        None,
        description="the reference engine's default `--weights-dir`: the directory with "
        "`model.safetensors` to serve; unset: seeded weights",
    )
    engine_threads: int = Field(
        1,
        ge=1,
        description="the reference engine's default `--threads`: torch CPU threads per server",
    )
    engine_api_key: SecretStr | None = Field(
        None,
        description="the reference engine requires `Authorization: Bearer <this>` on every "
        "route but `/health*` and `/metrics` (SGLang's `--api-key`); unset: no authentication",
    )
