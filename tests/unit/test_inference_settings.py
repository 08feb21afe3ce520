"""kdtree_inference.settings: the package's KDTREE_* variables, read once, refused by name."""

from __future__ import annotations

import pytest

from kdtree_inference.engine.__main__ import main as engine_main
from kdtree_inference.engine.server import build_parser
from kdtree_inference.exit_codes import ExitCode
from kdtree_inference.settings import InferenceSettings, SettingsError, VerifyMode


def test_a_given_mapping_is_read_and_the_process_environment_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KDTREE_VERIFY", "on")
    monkeypatch.setenv("KDTREE_ENGINE_THREADS", "3")
    assert InferenceSettings.from_env().verify is VerifyMode.ON
    assert InferenceSettings.from_env().engine_threads == 3
    assert InferenceSettings.from_env({}) == InferenceSettings.from_env({"KDTREE_VERIFY": " "})
    assert InferenceSettings.from_env({}).verify is VerifyMode.OFF


def test_the_engine_cli_takes_its_defaults_from_the_settings() -> None:
    settings = InferenceSettings.from_env(
        {"KDTREE_ENGINE_WEIGHTS": "/weights", "KDTREE_ENGINE_THREADS": "4"}
    )
    args = build_parser(settings).parse_args([])
    assert (args.weights_dir, args.threads) == ("/weights", 4)
    assert build_parser(InferenceSettings.from_env({})).parse_args([]).weights_dir is None


def test_the_engine_refuses_a_bad_variable_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KDTREE_ENGINE_THREADS", "many")
    assert engine_main([]) == ExitCode.REFUSED
    assert "KDTREE_ENGINE_THREADS='many': expected an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="KDTREE_ENGINE_THREADS='0'"):
        InferenceSettings.from_env({"KDTREE_ENGINE_THREADS": "0"})
