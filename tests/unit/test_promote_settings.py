"""promote's KDTREE_* settings, the arch list it builds for, and its command line."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import get_args

import pytest

from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.promote import cli
from kdtree_parity.promote.docker import Docker
from kdtree_parity.promote.errors import PromotionError
from kdtree_parity.promote.flow import PromotionOptions, build_images
from kdtree_parity.promote.profiles import GATE_PROFILES, GateProfileName
from kdtree_parity.promote.settings import CUDA_ARCHS_FILE, PromoteSettings, checkout_cuda_archs
from kdtree_verify._build import DEFAULT_ARCHS

ROOT = Path(__file__).resolve().parents[2]
# Each variable promote reads, the setting it fills, and its default when unset.
VARIABLES = {
    "KDTREE_GATE_PROFILE": ("gate_profile", "gate"),
    "KDTREE_IMAGE": ("image", None),
    "KDTREE_PROMOTIONS_DIR": ("promotions_dir", Path("promotions")),
    "KDTREE_PUSH": ("push", False),
    "KDTREE_PARITY_IMAGE_REPO": ("parity_image_repo", "kdtree/parity"),
    "KDTREE_GATE_BASELINE_IMAGE": ("gate_baseline_image", None),
    "KDTREE_REPORTS_DIR": ("reports_dir", Path("runs/reports")),
    "KDTREE_CUDA_ARCHS": ("cuda_archs", None),
    "KDTREE_HEALTH_TIMEOUT": ("health_timeout", 1800),
    "KDTREE_GATE_FLOOR": ("gate_floor", False),
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_settings_default_as_documented_and_every_field_is_described(clean_env) -> None:
    settings = PromoteSettings()
    assert set(PromoteSettings.model_fields) == {field for field, _ in VARIABLES.values()}
    for field, default in VARIABLES.values():
        assert getattr(settings, field) == default, field
        assert PromoteSettings.model_fields[field].description, field


def test_each_variable_sets_its_setting(clean_env) -> None:
    values = {
        "KDTREE_GATE_PROFILE": ("demo", "demo"),
        "KDTREE_IMAGE": ("r.example/kdtree/x", "r.example/kdtree/x"),
        "KDTREE_PROMOTIONS_DIR": ("/p", Path("/p")),
        "KDTREE_PUSH": ("1", True),
        "KDTREE_PARITY_IMAGE_REPO": ("r.example/parity", "r.example/parity"),
        "KDTREE_GATE_BASELINE_IMAGE": ("kdtree/inference:old", "kdtree/inference:old"),
        "KDTREE_REPORTS_DIR": ("/r", Path("/r")),
        "KDTREE_CUDA_ARCHS": ("90", "90"),
        "KDTREE_HEALTH_TIMEOUT": ("60", 60),
        "KDTREE_GATE_FLOOR": ("yes", True),
    }
    assert set(values) == set(VARIABLES)
    for name, (text, _) in values.items():
        clean_env.setenv(name, text)
    settings = PromoteSettings()
    for name, (_, expected) in values.items():
        assert getattr(settings, VARIABLES[name][0]) == expected, name


def test_an_empty_variable_means_its_default(clean_env) -> None:
    clean_env.setenv("KDTREE_IMAGE", "")
    clean_env.setenv("KDTREE_HEALTH_TIMEOUT", "")
    settings = PromoteSettings()
    assert settings.image is None and settings.health_timeout == 1800


def test_a_bad_variable_is_refused_in_one_line_naming_it(clean_env, capsys) -> None:
    clean_env.setenv("KDTREE_HEALTH_TIMEOUT", "ten")
    clean_env.setenv("KDTREE_GATE_PROFILE", "gpu")
    assert cli.main(["promote"]) == ExitCode.ERROR
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("error: KDTREE_GATE_PROFILE='gpu': expected"), lines
    assert lines[1].startswith("KDTREE_HEALTH_TIMEOUT='ten': expected an integer"), lines


def test_every_gate_profile_name_has_a_profile() -> None:
    assert set(GATE_PROFILES) == set(get_args(GateProfileName))


def test_flags_default_to_the_settings(clean_env) -> None:
    clean_env.setenv("KDTREE_PUSH", "1")
    clean_env.setenv("KDTREE_REPORTS_DIR", "/r")
    clean_env.setenv("KDTREE_HEALTH_TIMEOUT", "60")
    args = cli.build_parser().parse_args(["promote"])
    assert args.push is True and args.reports == Path("/r") and args.health_timeout == 60
    assert args.run is cli._run_promote
    args = cli.build_parser().parse_args(["promote", "--health-timeout", "5"])
    assert args.health_timeout == 5  # a flag wins over its variable
    assert cli.build_parser().parse_args(["rollback"]).run is cli._run_rollback
    gate = cli.build_parser().parse_args(["gate", "--run-id", "x"])
    assert gate.run is cli._run_gate and gate.run_id == "x" and not hasattr(gate, "records")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KDTREE_GATE_PROFILE", "nightly"),
        ("KDTREE_HEALTH_TIMEOUT", "soon"),
        ("KDTREE_PUSH", "perhaps"),
    ],
)
def test_an_unusable_variable_is_an_error_naming_it(
    clean_env, capsys: pytest.CaptureFixture[str], name: str, value: str
) -> None:
    clean_env.setenv(name, value)
    assert cli.main(["rollback"]) == ExitCode.ERROR
    assert f"{name}={value!r}" in capsys.readouterr().err


class _RecordingDocker(Docker):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    def run(self, *args: str, check: bool = True, capture: bool = True):  # type: ignore[override]
        self.calls.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")


def _options(**changes: object) -> PromotionOptions:
    base: dict[str, object] = {
        "image": "kdtree/inference",
        "parity_image": "kdtree/parity",
        "revision": "rev1",
        "compose_file": Path("compose.yaml"),
        "records_dir": Path("promotions"),
        "reports_dir": Path("runs/reports"),
        "context_dir": Path("."),
    }
    return PromotionOptions(**{**base, **changes})


def _built_archs(docker: _RecordingDocker) -> list[str]:
    return [arg for call in docker.calls for arg in call if arg.startswith("KDTREE_CUDA_ARCHS=")]


def test_the_image_is_built_for_the_checkout_arch_list_unless_overridden(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    assert (ROOT / CUDA_ARCHS_FILE).read_text() == f"{DEFAULT_ARCHS}\n"
    docker = _RecordingDocker()
    build_images(_options(), docker)
    assert _built_archs(docker) == [f"KDTREE_CUDA_ARCHS={DEFAULT_ARCHS}"]
    docker = _RecordingDocker()
    build_images(_options(cuda_archs="90"), docker)
    assert _built_archs(docker) == ["KDTREE_CUDA_ARCHS=90"]

    monkeypatch.chdir(tmp_path)  # not a checkout: no arch list to read
    with pytest.raises(PromotionError, match="KDTREE_CUDA_ARCHS"):
        build_images(_options(), _RecordingDocker())
    (tmp_path / "archs.txt").write_text("\n")
    with pytest.raises(PromotionError, match="is empty"):
        checkout_cuda_archs(tmp_path / "archs.txt")
