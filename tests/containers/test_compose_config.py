"""The serve and gate profiles resolve with the real Compose v2 (`docker compose config`).

No daemon is needed: `config` is Compose's own reading of compose.yaml and .env, interpolation
included. Once with every variable at its default, and once for every `docker compose` example
in docs/operations.md, run with the variables the example sets.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from container_support import ROOT, compose_command, run

pytestmark = pytest.mark.usefixtures("compose_cli")
DOCS = ROOT / "docs" / "operations.md"
ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$", re.S)


def resolved(*profile_args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    # A variable the caller's shell carries would change the result; compose.yaml reads every one
    # as ${VAR:-default}, so an empty value is the default.
    clean = {name: "" for name in re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE_TEXT)}
    result = run(
        *compose_command("kdtree", *profile_args, "config", "--format", "json"),
        env={**clean, **(env or {})},
    )
    return json.loads(result.stdout)["services"]


COMPOSE_TEXT = (ROOT / "compose.yaml").read_text()


def test_every_variable_has_a_default_for_empty_too() -> None:
    # What resolved() relies on: ${VAR-x} would treat "" differently from unset.
    assert not re.search(r"\$\{[A-Z0-9_]+-", COMPOSE_TEXT)


def test_the_gate_resolves_with_every_default() -> None:
    services = resolved()  # no --profile: .env's COMPOSE_PROFILES=gate
    assert set(services) == {"inference-baseline", "inference-candidate", "parity"}
    baseline, candidate = services["inference-baseline"], services["inference-candidate"]
    assert baseline["environment"]["KDTREE_VERIFY"] == "off"
    assert candidate["environment"]["KDTREE_VERIFY"] == "on"
    assert "--enable-deterministic-inference" in baseline["command"]
    assert candidate["image"] == baseline["image"] == "kdtree/inference:latest"
    for service, gpu in ((baseline, "0"), (candidate, "1")):
        [device] = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["device_ids"] == [gpu]
        assert service["healthcheck"]["test"][0] == "CMD-SHELL"
    assert services["parity"]["depends_on"]["inference-candidate"]["condition"] == "service_healthy"
    assert services["parity"]["user"] == "10001:10001"


def test_serve_resolves_with_every_default() -> None:
    services = resolved("--profile", "serve")
    assert set(services) == {"inference"}
    inference = services["inference"]
    assert inference["image"] == "kdtree/inference:latest" and "build" not in inference
    assert inference["environment"]["KDTREE_VERIFY"] == "on"
    [port] = inference["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "30000", 30000)
    assert inference["command"][inference["command"].index("--tp") + 1] == "1"


def _documented_examples() -> list[tuple[str, dict[str, str], list[str]]]:
    """(example line, the variables it sets, compose's arguments) for each example in the docs."""
    examples = []
    for block in re.findall(r"```bash\n(.*?)```", DOCS.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split("  #")[0])
            env = {}
            while words and ASSIGNMENT.match(words[0]):
                name, value = ASSIGNMENT.match(words.pop(0)).groups()
                env[name] = value
            if words[:2] == ["docker", "compose"] and "up" in words and env:
                examples.append((line.strip(), env, words[2 : words.index("up")]))
    return examples


EXAMPLES = _documented_examples()


def test_the_docs_carry_examples_to_check() -> None:
    profiles = {" ".join(args) for _, _, args in EXAMPLES}
    assert {"--profile serve", ""} <= profiles, EXAMPLES


@pytest.mark.parametrize(("line", "env", "args"), EXAMPLES, ids=[e[0][:60] for e in EXAMPLES])
def test_each_documented_example_resolves(line: str, env: dict[str, str], args: list[str]) -> None:
    services = resolved(*args, env=env)
    text = json.dumps(services)
    for name, value in env.items():
        # Every value the example sets shows up where compose.yaml puts it.
        pieces = shlex.split(value) if name.endswith("_ARGS") else [value]
        for piece in pieces:
            assert json.dumps(piece) in text or piece in text, f"{name}={value} is lost: {line}"
    for service in services.values():
        if "devices" in json.dumps(service.get("deploy", {})):
            assert service["healthcheck"]["test"][0] == "CMD-SHELL"


def test_a_wrong_variable_value_is_reported_by_compose(tmp_path: Path) -> None:
    # Compose reads ports strictly: a non-numeric port makes `config` fail, which is what
    # a user with a typo sees before anything starts.
    result = run(
        *compose_command("kdtree", "--profile", "serve", "config"),
        env={"KDTREE_PORT": "thirty"},
        check=False,
    )
    assert result.returncode != 0 and "thirty" in result.stderr
