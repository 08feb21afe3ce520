"""A small model of how Docker Compose reads compose.yaml: .env, interpolation, profiles.

Shared by the static compose tests and the stand-in ``docker`` of the promotion tests, so both
read the file the same way Compose does (no Docker engine exists in CI).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])((?:[^{}]|\{[^{}]*\})*))?\}")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message} over the whole tree."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3) or ""
        current = env.get(name)
        if operator == ":-":
            return current if current else interpolate(argument, env)
        if operator == "-":
            return current if current is not None else interpolate(argument, env)
        if operator == ":?" and not current:
            raise KeyError(f"{name}: {argument}")
        return current or ""

    return _VAR.sub(substitute, value).replace("$$", "$")


def dotenv(compose_file: Path = COMPOSE_FILE) -> dict[str, str]:
    """The .env beside the compose file, as Compose reads it (KEY=VALUE, # comments)."""
    path = compose_file.parent / ".env"
    pairs: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                pairs[key.strip()] = value.strip()
    return pairs


def load_compose(
    env: Mapping[str, str] | None = None, compose_file: Path = COMPOSE_FILE
) -> dict[str, Any]:
    """The file after interpolation; ``env`` (the shell's) wins over .env, as in Compose."""
    raw = yaml.safe_load(compose_file.read_text())
    raw = {k: v for k, v in raw.items() if not k.startswith("x-")}
    return interpolate(raw, {**dotenv(compose_file), **(env or {})})


def enabled_services(compose: dict[str, Any], profiles: list[str] | None) -> set[str]:
    """What `docker compose [--profile P ...] up` starts: a --profile flag replaces .env's."""
    active = set(profiles) if profiles else set(dotenv().get("COMPOSE_PROFILES", "").split(","))
    return {
        name
        for name, service in compose["services"].items()
        if not service.get("profiles") or active & set(service["profiles"])
    }


def command_args(service: dict[str, Any]) -> list[str]:
    """A string command is split the way Compose splits it (shell words)."""
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [d for d in devices.get("devices", []) if "gpu" in d.get("capabilities", [])]
