"""The one dialect of kdtree's environment settings.

Every package's settings model (``kdtree_inference.settings.InferenceSettings``,
``kdtree_parity.settings.ParitySettings``, ``kdtree_parity.promote.settings.PromoteSettings``,
``kdtree_verify._settings.BuildSettings``) derives from
:class:`EnvSettings`, so all of them:

- read the process environment, or a given mapping instead of it (``from_env(env)``: then
  ``os.environ`` does not mix in);
- take a value that is unset, empty or blank (only whitespace) as unset: the field's default;
- refuse bad values with :class:`SettingsError`, one line per bad variable, each naming the
  variable, the value and what it expects: ``KDTREE_X='ten': expected an integer >= 1``.

Pure Python on pydantic-settings alone: the kernel (torch only) and the parity sidecar (no torch)
import it as well as the inference package.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUseDefault
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

__all__ = ["EnvSettings", "SettingsError", "expectation", "on_off", "refusal_text"]

_Settings = TypeVar("_Settings", bound="EnvSettings")  # Python 3.10 has no typing.Self


class SettingsError(ValueError):
    """Environment variables hold values a program cannot use: one line per variable, each
    naming it."""


def on_off(value: Any) -> Any:
    """``on``/``off`` (any case) as a bool; other text stays text, which a strict bool refuses."""
    if isinstance(value, str):
        return {"on": True, "off": False}.get(value.strip().lower(), value)
    return value


class EnvSettings(BaseSettings):
    """A settings model in the shared dialect; subclasses set ``env_prefix`` in ``model_config``
    and may set ``error_type`` (a :class:`SettingsError` subclass) for their refusals."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore")
    error_type: ClassVar[type[SettingsError]] = SettingsError

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                field = cls.model_fields[str(info.field_name)]
                # BaseSettings validates defaults too: a blank default is itself the value.
                default = field.get_default(call_default_factory=True)
                if isinstance(default, str) and not default.strip():
                    return default
                raise PydanticUseDefault
        return value

    @classmethod
    def env_var(cls, field_name: str) -> str:
        """The environment variable that sets ``field_name``: its alias, else prefix + name."""
        field = cls.model_fields[field_name]
        if isinstance(field.validation_alias, str):
            return field.validation_alias
        return str(cls.model_config.get("env_prefix", "")) + field_name.upper()

    @classmethod
    def from_env(cls: type[_Settings], env: Mapping[str, str] | None = None) -> _Settings:
        """Every setting from ``env`` (default: the process environment) and nothing else;
        ``error_type`` names every bad variable, one a line."""
        try:
            if env is None:
                return cls()
            # The mapping replaces BaseSettings' own sources: os.environ does not mix in.
            return cls(_build_sources=((_MappingEnvSource(cls, env),), {}))
        except ValidationError as error:
            raise cls.refusal(error) from None

    @classmethod
    def refusal(cls, error: ValidationError) -> SettingsError:
        """The :class:`SettingsError` for ``error``: one line per bad variable, in field order."""
        return cls.error_type(refusal_text(error, cls.model_fields, cls.env_var))


def refusal_text(
    error: ValidationError, fields: Mapping[str, FieldInfo], name: Callable[[str], str]
) -> str:
    """``error`` in the dialect: one line per bad field, in field order, each ``NAME='value':
    expected ...`` (or a validator's own message). ``name`` spells a field's name (for settings,
    its variable); a model that is not read from the environment passes the identity."""
    lines: dict[str, str] = {}
    # an error's location is the field's alias where it has one
    aliases = {
        field.validation_alias: key
        for key, field in fields.items()
        if isinstance(field.validation_alias, str)
    }
    problems = []
    for detail in error.errors():
        key = str(detail["loc"][0]) if detail["loc"] else ""
        key = aliases.get(key, key)
        if key in fields and key not in lines:
            lines[key] = _line(name(key), fields[key], detail)
        elif key not in fields:  # a check of several fields: its own message
            problems.append(str(detail.get("ctx", {}).get("error", detail["msg"])))
    ordered = [lines[key] for key in fields if key in lines]
    return "\n".join(ordered + problems) or str(error)


def _line(variable: str, field: FieldInfo, detail: ErrorDetails) -> str:
    if detail["type"] == "value_error":  # a validator's own refusal
        message = str(detail.get("ctx", {}).get("error", detail["msg"]))
        if message.startswith(variable):  # it names the variable already
            return message
        return f"{variable}={detail['input']!r}: {message}"
    return f"{variable}={detail['input']!r}: expected {expectation(field)}"


def _bound(field: FieldInfo, attribute: str) -> Any:
    return next(
        (getattr(m, attribute) for m in field.metadata if getattr(m, attribute, None) is not None),
        None,
    )


def expectation(field: FieldInfo) -> str:
    """What a field accepts, in the words of its refusal message."""
    annotation = field.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            annotation = members[0]
    if annotation is bool:
        return "on or off"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + "|".join(str(member.value) for member in annotation)
    if get_origin(annotation) is Literal:
        return "one of " + "|".join(str(choice) for choice in get_args(annotation))
    ge, gt, le, lt = (_bound(field, a) for a in ("ge", "gt", "le", "lt"))
    low = f">= {ge:g}" if ge is not None else f"> {gt:g}" if gt is not None else ""
    high = f"<= {le:g}" if le is not None else f"< {lt:g}" if lt is not None else ""
    limits = " and ".join(part for part in (low, high) if part)
    if annotation is int:
        return f"an integer {limits}".rstrip()
    if annotation is float:
        if limits == ">= 0":
            return "a non-negative number"
        return f"a number {limits}".rstrip()
    return "a " + getattr(annotation, "__name__", str(annotation)).lower()


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env_vars = parse_env_vars(
            env, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )
