"""The inference package's settings: every ``KDTREE_*`` variable its programs read, in one model.

The SGLang backend (``sglang.modes.VerifySettings``), ``kdtree-serve`` and the reference engine
(``kdtree-engine``) read them from here; README.md's configuration table is generated from the
fields' descriptions (``scripts/config_table.py``). A variable that is unset, empty or blank
takes its default; a bad value is refused with :class:`SettingsError`, naming the variable.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    Strict,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUseDefault
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from kdtree_verify.validation import FP8_NUMERICS

from .faults import Fault, parse_fault

ENV_PREFIX = "KDTREE_"


class VerifyMode(enum.Enum):
    """``KDTREE_VERIFY``: which attention serves the verify forward."""

    OFF = "off"
    VALIDATE = "validate"
    ON = "on"


class SettingsError(ValueError):
    """An environment variable holds a value the programs cannot use; the message names it."""


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _on_off(value: Any) -> Any:
    """``on``/``off`` as a bool; any other text stays text, which the strict bool refuses."""
    return {"on": True, "off": False}.get(value, value) if isinstance(value, str) else value


def _fault(value: Any) -> Any:
    return parse_fault(value) if isinstance(value, str) else value


Word = BeforeValidator(_lower)
Switch = Annotated[bool, Strict(), BeforeValidator(_on_off), Word]


class InferenceSettings(BaseSettings):
    """The SGLang backend's, ``kdtree-serve``'s and the reference engine's ``KDTREE_*`` settings."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

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
        description="an element is over tolerance when not |kernel − triton| <= atol + "
        "rtol·|triton|; unset: by the KV pool, `0.02` bf16, `0.125` fp8 (one e4m3 step of an "
        "attention weight, docs/kernel-fp8.md)",
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
    sglang_launcher: str | None = Field(
        None,
        description="the command `kdtree-serve` execs (split like a shell), followed by its "
        "arguments; unset: `python -m sglang.launch_server` of this interpreter",
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

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                raise PydanticUseDefault
        return value

    @classmethod
    def env_var(cls, field_name: str) -> str:
        """The environment variable that sets ``field_name``."""
        return ENV_PREFIX + field_name.upper()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> InferenceSettings:
        """Read every setting from ``env`` (default: the process environment) and nothing else;
        raise :class:`SettingsError` naming the first bad variable."""
        try:
            if env is None:
                return cls()
            # The mapping replaces BaseSettings' own sources: os.environ does not mix in.
            return cls(_build_sources=((_MappingEnvSource(cls, env),), {}))
        except ValidationError as error:
            raise cls._refusal(error) from None

    @classmethod
    def _refusal(cls, error: ValidationError) -> SettingsError:
        first = error.errors()[0]
        name = str(first["loc"][0])
        if first["type"] == "value_error":  # a parser's own refusal, which names the variable
            return SettingsError(str(first["ctx"]["error"]))
        expected = _expectation(cls.model_fields[name])
        return SettingsError(f"{cls.env_var(name)}={first['input']!r}: expected {expected}")


def _expectation(field: FieldInfo) -> str:
    """What a field accepts, in the words of its refusal message."""
    annotation = field.annotation
    if annotation is bool:
        return "on or off"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + "|".join(member.value for member in annotation)
    choices = getattr(annotation, "__args__", ())
    if getattr(annotation, "__origin__", None) is Literal:
        return "one of " + "|".join(choices)
    minimum = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
    if annotation is int:
        return f"an integer >= {minimum}"
    if minimum == 0:
        return "a non-negative number"
    return "a number"


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env_vars = parse_env_vars(
            env, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )
