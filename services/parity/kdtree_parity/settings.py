"""The gate's configuration (``kdtree-parity`` and its service): every ``KDTREE_PARITY_*``
variable, its default and its meaning. ``kdtree-parity`` flags override them.

README's Configuration table is generated from the field descriptions below. The model speaks
the shared dialect (``kdtree_settings.EnvSettings``): unset, empty or blank is the default, and
bad values are refused one line per variable, each naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import kdtree_settings
from kdtree_settings import EnvSettings
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

ENV_PREFIX = "KDTREE_PARITY_"
LEASE_RANGE_S = (1.0, 3600.0)
# The targets that may carry a bearer token (the replica is the A/A twin when there is one).
TOKEN_TARGETS = ("baseline", "candidate", "replica", "floor")


class SettingsError(kdtree_settings.SettingsError):
    """A ``KDTREE_PARITY_*`` variable holds a value the gate cannot use (one line per variable)."""


class ParitySettings(EnvSettings):
    """Read from the environment once, when a program starts (``load_settings``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)
    error_type: ClassVar[type[kdtree_settings.SettingsError]] = SettingsError

    # The ports `make up` publishes the gate pair on (docs/operations.md, "Ports").
    baseline_url: str = Field("http://127.0.0.1:30001", description="baseline inference server")
    candidate_url: str = Field("http://127.0.0.1:30002", description="candidate inference server")
    replica_url: str = Field(
        "", description="optional second baseline for A/A noise (else the baseline twice)"
    )
    floor_url: str = Field(
        "",
        description="optional A/A' target: the baseline computed an equivalent, not "
        "bit-identical way; the candidate is judged by its excess over it (docs/parity.md, "
        "'A/A noise and the A/A' floor')",
    )
    baseline_image: str = Field(
        "", description="image digest/reference of the baseline, recorded in the report"
    )
    candidate_image: str = Field(
        "", description="image digest/reference of the candidate, recorded in the report"
    )
    replica_image: str = Field(
        "", description="image digest/reference of the replica, recorded in the report"
    )
    floor_image: str = Field(
        "", description="image digest/reference of the A/A' target, recorded in the report"
    )
    corpus: str = Field(
        "long",
        description="corpus: a JSONL path or a shipped name (long: default + prompts to 200k "
        "tokens, generated; default; short)",
    )
    policy: str = Field(
        "default", description="policy: a YAML path or a shipped name (default, short)"
    )
    db: str = Field("runs/parity.sqlite3", description="SQLite database of runs")
    out: str = Field(
        "runs/parity", description="reports are written to OUT/RUN_ID/report.{json,html,md}"
    )
    lease_s: float = Field(
        60.0,
        description="seconds a run stays claimed by its process without a heartbeat "
        f"({LEASE_RANGE_S[0]:g}..{LEASE_RANGE_S[1]:g}; renewed every sixth of it); another "
        "process may take the run over after that",
    )
    token: str = Field(
        "", description="service: bearer token for POST /runs (unset: mutating endpoints refuse)"
    )
    pairs: str = Field(
        "",
        description="service: YAML file of named target pairs (else one pair 'default' from "
        "the URLs)",
    )
    baseline_token: SecretStr | None = Field(
        None,
        description="bearer token the baseline requires (SGLang's `--api-key`); never printed or "
        "stored; or `KDTREE_PARITY_BASELINE_TOKEN_FILE`",
    )
    baseline_token_file: str = Field("", description="a file holding the baseline's token")
    candidate_token: SecretStr | None = Field(
        None, description="bearer token the candidate requires; or `..._CANDIDATE_TOKEN_FILE`"
    )
    candidate_token_file: str = Field("", description="a file holding the candidate's token")
    replica_token: SecretStr | None = Field(
        None, description="bearer token the replica (A/A twin) requires; or `..._TOKEN_FILE`"
    )
    replica_token_file: str = Field("", description="a file holding the replica's token")
    floor_token: SecretStr | None = Field(
        None, description="bearer token the A/A' target requires; or `..._FLOOR_TOKEN_FILE`"
    )
    floor_token_file: str = Field("", description="a file holding the A/A' target's token")
    progress_every: int = Field(
        10,
        ge=1,
        description="without a terminal (CI), `run` prints a progress line every this many "
        "prompts (or every `KDTREE_PARITY_PROGRESS_SECONDS`)",
    )
    progress_seconds: float = Field(
        30.0, gt=0, description="without a terminal, a progress line at least this often"
    )
    host: str = Field("127.0.0.1", description="service: bind address")
    port: int = Field(8300, description="service: port")

    @field_validator("lease_s")
    @classmethod
    def _lease_in_range(cls, lease: float) -> float:
        low, high = LEASE_RANGE_S
        if not low <= lease <= high:  # also refuses nan
            raise ValueError(f"must be {low:g}..{high:g} seconds, got {lease:g}")
        return lease


def load_settings(env: Mapping[str, str] | None = None) -> ParitySettings:
    """The settings from the environment (or ``env`` alone); SettingsError names every variable
    that is unusable, one a line."""
    return ParitySettings.from_env(env)


def target_tokens(settings: ParitySettings) -> dict[str, str]:
    """Bearer token by target (baseline, candidate, replica, floor) from the environment
    (``KDTREE_PARITY_<TARGET>_TOKEN``) or a file (``..._TOKEN_FILE``: its content, surrounding
    whitespace stripped). SettingsError, naming the variable and never the token, when both are
    set, the file cannot be read or it is empty."""
    tokens: dict[str, str] = {}
    problems = []
    for target in TOKEN_TARGETS:
        secret: SecretStr | None = getattr(settings, f"{target}_token")
        path: str = getattr(settings, f"{target}_token_file")
        variable = f"{ENV_PREFIX}{target.upper()}_TOKEN"
        if secret is not None and secret.get_secret_value() and path:
            problems.append(f"{variable} and {variable}_FILE are both set: give one")
            continue
        if path:
            try:
                token = Path(path).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{variable}_FILE={path!r} cannot be read: {type(exc).__name__}")
                continue
            if not token:
                problems.append(f"{variable}_FILE={path!r} is empty")
                continue
            tokens[target] = token
        elif secret is not None and secret.get_secret_value().strip():
            tokens[target] = secret.get_secret_value().strip()
    if problems:
        raise SettingsError("\n".join(problems))
    return tokens
