"""One port plan: compose.yaml's published ports, the Makefile's targets, the CLI defaults and
the table in docs/operations.md ("Ports") say the same thing.

Read the way Compose reads the files (``compose_model``), with an empty shell environment, so
the defaults are what a fresh checkout does.
"""

from __future__ import annotations

import re

import msgspec
import pytest
from compose_model import ROOT, enabled_services, load_compose
from sglang.srt.server_args import ServerArgs

from kdtree_inference.engine.server import build_parser
from kdtree_inference.settings import InferenceSettings
from kdtree_parity.settings import ParitySettings

MAKEFILE = (ROOT / "Makefile").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose(env={})


def host_port(service: dict) -> int:
    """The default host port a service publishes (``ADDRESS:HOST:CONTAINER``)."""
    (mapping,) = service["ports"]
    _address, host, container = mapping.split(":")
    assert container == "30000", "every server listens on 30000 inside its container"
    return int(host)


def published(compose: dict) -> dict[str, int]:
    return {
        name: host_port(service)
        for name, service in compose["services"].items()
        if service.get("ports")
    }


def url_port(url: str) -> int:
    match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)", url)
    assert match, url
    return int(match.group(1))


def recipe(target: str) -> str:
    match = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", MAKEFILE, re.MULTILINE)
    assert match, f"Makefile has no target {target}"
    return match.group(1)


def ports_table() -> dict[int, str]:
    """docs/operations.md's "Ports" table: host port -> its row."""
    section = OPERATIONS.split("\n## Ports\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \|(.*)$", section, re.MULTILINE)
    return {int(port): row for port, row in rows}


def test_make_up_then_make_parity_compares_the_pair_up_started(
    compose: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KDTREE_PARITY_BASELINE_URL", "KDTREE_PARITY_CANDIDATE_URL"):
        monkeypatch.delenv(name, raising=False)
    settings = ParitySettings()
    # `make up` is a plain `compose up`: the profiles .env enables.
    assert "--profile" not in recipe("up") and " up " in recipe("up")
    gate = enabled_services(compose, None)
    assert {"inference-baseline", "inference-candidate"} <= gate
    ports = published(compose)
    assert url_port(settings.baseline_url) == ports["inference-baseline"]
    assert url_port(settings.candidate_url) == ports["inference-candidate"]
    # `make parity` passes no URLs: the defaults above decide.
    assert "kdtree-parity run $(PARITY_ARGS)" in recipe("parity")
    assert "--baseline" not in recipe("parity") and "--candidate" not in recipe("parity")


def test_make_serve_publishes_the_port_every_single_server_defaults_to(compose: dict) -> None:
    assert "--profile serve up" in recipe("serve")
    serve = {n for n in enabled_services(compose, ["serve"]) if compose["services"][n].get("ports")}
    assert serve == {"inference"}
    engine_default = build_parser(InferenceSettings()).get_default("port")
    (sglang_default,) = [f.default for f in msgspec.structs.fields(ServerArgs) if f.name == "port"]
    assert published(compose)["inference"] == engine_default == sglang_default == 30000


def test_profiles_that_run_together_never_share_a_host_port(compose: dict) -> None:
    ports = published(compose)
    assert len(set(ports.values())) == len(ports), ports


def test_the_documented_plan_is_compose_and_the_defaults(compose: dict) -> None:
    table = ports_table()
    ports = published(compose)
    for service, port in ports.items():
        assert port in table, f"{service} publishes {port}, which the Ports table lacks"
        assert f"`{service}`" in table[port], (service, port, table[port])
    settings = ParitySettings()
    assert "`--baseline` default" in table[url_port(settings.baseline_url)]
    assert "`--candidate` default" in table[url_port(settings.candidate_url)]
    assert settings.port in table and "parity service" in table[settings.port]
    assert set(table) == {*ports.values(), settings.port}
