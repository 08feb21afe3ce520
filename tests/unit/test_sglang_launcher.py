"""``kdtree-serve``: runs the installed console script; SGLang's launcher is replaced, through
KDTREE_SGLANG_LAUNCHER, by a stand-in that records the argv it was executed with."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kdtree_inference.exit_codes import ExitCode
from kdtree_inference.settings import InferenceSettings
from kdtree_inference.sglang.launcher import (
    flag_values,
    launch_command,
    preflight,
)
from kdtree_inference.sglang.modes import VerifyMode, VerifySettings

KDTREE_SERVE = Path(sys.executable).with_name("kdtree-serve")
ARGS = [
    "--model-path",
    "/models/DeepSeek-V3",
    "--attention-backend",
    "triton",
    "--speculative-algorithm",
    "EAGLE",
    "--chat-template",
    "a b  c",
    "--json-model-override-args",
    '{"x": [1, 2]}',
    "--tp=8",
    "--",
    "ünïcode",
]


@pytest.fixture
def standin(tmp_path):
    record = tmp_path / "argv.json"
    script = tmp_path / "fake_sglang.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            with open({str(record)!r}, "w") as f:
                json.dump(sys.argv[1:], f)
            with open({str(record)!r} + ".topk", "w") as f:
                f.write(os.environ.get("KDTREE_DDTREE_TOPK", ""))
            sys.exit(int(__import__("os").environ.get("FAKE_SGLANG_EXIT", "0")))
            """
        )
    )
    return record, f"{sys.executable} {script}"


def serve(args, launcher, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("KDTREE_", "SGLANG_"))}
    full_env.update(KDTREE_SGLANG_LAUNCHER=launcher, **env)
    return subprocess.run(
        [str(KDTREE_SERVE), *args], env=full_env, capture_output=True, text=True, timeout=120
    )


def test_off_passes_every_argument_through_unchanged(standin):
    record, launcher = standin
    result = serve(ARGS, launcher, KDTREE_VERIFY="off")
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text()) == ARGS
    assert "kdtree-serve: mode: KDTREE_VERIFY=off" in result.stderr
    assert "kdtree-serve: exec " in result.stderr


def test_exit_status_is_sglangs(standin):
    record, launcher = standin
    result = serve(["--port", "1"], launcher, FAKE_SGLANG_EXIT="3")
    assert result.returncode == 3
    assert json.loads(record.read_text()) == ["--port", "1"]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
@pytest.mark.parametrize("mode", ["on", "validate"])
def test_kernel_modes_refuse_without_a_usable_kernel(standin, mode):
    record, launcher = standin
    result = serve(ARGS, launcher, KDTREE_VERIFY=mode)
    assert result.returncode == ExitCode.REFUSED
    assert (
        f"refusing to start with KDTREE_VERIFY={mode}: no CUDA device is visible" in result.stderr
    )
    assert "set KDTREE_VERIFY=off" in result.stderr
    assert not record.exists(), "nothing may be launched after a refusal"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_reaches_sglang_in_kernel_modes_without_a_kernel(standin, flag):
    """Help starts no server: it is passed on even where `on` would refuse (no GPU here)."""
    record, launcher = standin
    result = serve([flag], launcher, KDTREE_VERIFY="on")
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text()) == [flag]
    assert "refusing" not in result.stderr


def test_other_attention_backends_are_refused(standin):
    record, launcher = standin
    result = serve(["--attention-backend=flashinfer"], launcher, KDTREE_VERIFY="on")
    assert result.returncode == ExitCode.REFUSED
    assert "--attention-backend flashinfer: the kdtree kernel replaces SGLang's 'triton'" in (
        result.stderr
    )
    assert not record.exists()


def test_plugin_left_out_by_sglang_plugins_is_refused(standin):
    record, launcher = standin
    result = serve(ARGS, launcher, KDTREE_VERIFY="on", SGLANG_PLUGINS="someone_else")
    assert result.returncode == ExitCode.REFUSED
    assert "SGLANG_PLUGINS='someone_else' does not include 'kdtree_verify'" in result.stderr
    assert not record.exists()


def test_bad_setting_is_refused_by_name(standin):
    record, launcher = standin
    result = serve(ARGS, launcher, KDTREE_VERIFY="maybe")
    assert result.returncode == ExitCode.REFUSED
    assert "KDTREE_VERIFY='maybe': expected one of off|validate|on" in result.stderr
    assert not record.exists()


def test_default_command_is_sglangs_launch_server():
    assert launch_command(["--port", "30000"], InferenceSettings.from_env({})) == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--port",
        "30000",
    ]


def test_preflight_passes_when_plugin_backend_and_kernel_are_fine():
    settings = VerifySettings(VerifyMode.ON)
    assert preflight(settings, ARGS, env={}, check_kernel=lambda: None) == []
    problems = preflight(settings, ARGS, env={}, check_kernel=lambda: "no kernel image for sm_120")
    assert problems == ["no kernel image for sm_120"]
    # off never checks anything
    assert preflight(VerifySettings(), ["--attention-backend", "fa3"], {}, lambda: "x") == []


def test_flag_values_reads_both_spellings():
    args = ["--attention-backend", "triton", "--decode-attention-backend=fa3", "--x"]
    assert flag_values(args, "--attention-backend") == ["triton"]
    assert flag_values(args, "--decode-attention-backend") == ["fa3"]
    assert flag_values(["--attention-backend"], "--attention-backend") == []


DDTREE = ["--model-path", "/m", "--speculative-algorithm", "DDTREE"]


def test_ddtree_flags_become_what_sglang_and_the_worker_read(standin):
    record, launcher = standin
    flags = ["--speculative-ddtree-budget", "32", "--speculative-ddtree-topk=4", "--port", "1"]
    result = serve([*DDTREE, *flags], launcher, KDTREE_VERIFY="off")
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text()) == [
        *DDTREE,
        "--port",
        "1",
        "--speculative-num-draft-tokens",
        "33",
    ]
    assert Path(str(record) + ".topk").read_text() == "4"
    # The same width given twice is fine; a different one is refused before SGLang starts.
    same = serve(
        [*DDTREE, "--speculative-ddtree-budget=8", "--speculative-num-draft-tokens", "9"],
        launcher,
        KDTREE_VERIFY="off",
    )
    assert same.returncode == 0, same.stderr
    assert json.loads(record.read_text()) == [*DDTREE, "--speculative-num-draft-tokens", "9"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--speculative-ddtree-budget", "0"],
            "--speculative-ddtree-budget=0: it must be at least 1",
        ),
        (["--speculative-ddtree-topk", "x"], "--speculative-ddtree-topk='x' is not an integer"),
        (["--speculative-ddtree-budget"], "--speculative-ddtree-budget needs a value"),
        (
            ["--speculative-ddtree-budget", "16", "--speculative-num-draft-tokens", "16"],
            "means --speculative-num-draft-tokens 17",
        ),
    ],
)
def test_bad_ddtree_flags_are_refused(standin, flags, message):
    record, launcher = standin
    result = serve([*DDTREE, *flags], launcher, KDTREE_VERIFY="off")
    assert result.returncode == ExitCode.REFUSED
    assert message in result.stderr
    assert not record.exists(), "SGLang was started"
