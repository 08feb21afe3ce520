"""The gate's settings (``KDTREE_PARITY_*``) and the checks every new run goes through."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdtree_parity.corpus import load_corpus
from kdtree_parity.runner import RunRefused, prepare_run
from kdtree_parity.service import ConfigurationError, load_pairs
from kdtree_parity.settings import ENV_PREFIX, ParitySettings, SettingsError, load_settings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ParitySettings.model_fields:
        monkeypatch.delenv(ENV_PREFIX + name.upper(), raising=False)
    return monkeypatch


def test_defaults_and_every_field_is_described(clean_env: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert settings.baseline_url == "http://127.0.0.1:30001"
    assert settings.candidate_url == "http://127.0.0.1:30002"
    assert (settings.corpus, settings.policy) == ("long", "default")  # default needs 200k
    assert (settings.db, settings.out) == ("runs/parity.sqlite3", "runs/parity")
    assert (settings.lease_s, settings.token, settings.pairs) == (60.0, "", "")
    assert (settings.host, settings.port) == ("127.0.0.1", 8300)
    undescribed = [name for name, f in ParitySettings.model_fields.items() if not f.description]
    assert undescribed == []


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LEASE_S", "soon", "KDTREE_PARITY_LEASE_S='soon': expected a number"),
        ("LEASE_S", "0", "KDTREE_PARITY_LEASE_S='0': must be 1..3600 seconds, got 0"),
        ("LEASE_S", "nan", "KDTREE_PARITY_LEASE_S='nan': must be 1..3600 seconds, got nan"),
        ("PORT", "http", "KDTREE_PARITY_PORT='http': expected an integer"),
    ],
)
def test_unusable_values_are_named(
    clean_env: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    clean_env.setenv(ENV_PREFIX + variable, value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == message


def test_the_cli_refuses_an_unusable_setting_in_one_line(tmp_path: Path) -> None:
    # The code under test, wherever the test imports it from (an editable install may be another
    # checkout's).
    path = os.pathsep.join(p for p in sys.path if p)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "KDTREE_PARITY_LEASE_S": "soon"}
    done = subprocess.run(
        [sys.executable, "-m", "kdtree_parity.cli", "run", "--db", str(tmp_path / "db")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "kdtree-parity: KDTREE_PARITY_LEASE_S='soon': expected a number"
    ]


def test_prepare_run_names_every_problem_in_order() -> None:
    with pytest.raises(RunRefused) as refused:
        prepare_run("short", "default", {"--baseline": "ftp://x", "--replica": None})
    small, short, url = refused.value.problems
    assert "needs 200" in small and small.endswith("such a run could never decide")
    assert "needs min_context_tokens 200000" in short and "--corpus long" in short
    assert url.startswith("--baseline: ")
    with pytest.raises(RunRefused) as refused:
        prepare_run("/nonexistent/corpus.jsonl", "/nonexistent/policy.yaml", {})
    assert len(refused.value.problems) == 2  # both inputs named, not only the first
    prepared = prepare_run(load_corpus("short"), "short", {"baseline": "http://127.0.0.1:9"})
    assert prepared.corpus.source == load_corpus("short").source
    assert prepared.policy.policy.gate.min_prompts <= len(prepared.corpus)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "expected a non-empty mapping of pair name -> targets"),
        ("{}\n", "expected a non-empty mapping of pair name -> targets"),
        ("gpu0: http://a:1\n", "pair 'gpu0' needs 'baseline' and 'candidate' URLs"),
        (
            "gpu0:\n  baseline: http://a:1\n  candidate: http://c:1\n  colour: red\n  zone: 1\n",
            "pair 'gpu0' has unknown key(s) ['colour', 'zone']",
        ),
        (
            "ok:\n  baseline: http://a:1\n  candidate: http://c:1\n7:\n  baseline: http://a:1\n",
            "pair '7' needs 'baseline' and 'candidate' URLs",
        ),
    ],
)
def test_the_pairs_file_is_refused_in_its_own_words(
    tmp_path: Path, text: str, message: str
) -> None:
    pairs = tmp_path / "pairs.yaml"
    pairs.write_text(text)
    with pytest.raises(ConfigurationError) as refused:
        load_pairs(pairs)
    assert str(refused.value) == f"{pairs}: {message}"
