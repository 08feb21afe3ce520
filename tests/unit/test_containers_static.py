"""Static checks of the Dockerfile, compose.yaml and the GitHub workflows.

The linters themselves (hadolint, the Compose and workflow schemas, actionlint, shellcheck) are
pre-commit hooks that `make lint` runs. These read the files for what the linters cannot know:
compose.yaml after interpolation against the Compose specification, and the wiring a user
relies on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_model import command_args, enabled_services, gpu_devices, load_compose

from kdtree_verify._build import DEFAULT_ARCHS, parse_archs

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GATE = {"inference-baseline", "inference-candidate", "parity"}
SGLANG_SERVICES = {"inference-baseline", "inference-candidate", "inference", "inference-floor"}
DEMO = {"demo-baseline", "demo-candidate", "demo-parity"}


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is not installed in the venv: run `make setup`"
    return str(path)


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- compose schema


def test_interpolated_compose_matches_the_compose_specification(tmp_path: Path) -> None:
    """compose.yaml as Compose reads it with the defaults filled in (the file as written is a
    pre-commit hook's)."""
    document = {**yaml.safe_load((ROOT / "compose.yaml").read_text())}
    resolved = {k: v for k, v in document.items() if k.startswith("x-")}
    resolved.update(load_compose())
    target = tmp_path / "compose.yaml"
    target.write_text(yaml.safe_dump(resolved))
    result = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(target))
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- compose wiring


def test_plain_up_starts_exactly_the_gate_trio() -> None:
    compose = load_compose()
    assert enabled_services(compose, None) == GATE
    assert enabled_services(compose, ["serve"]) == {"inference"}
    assert enabled_services(compose, ["demo"]) == DEMO
    # The A/A' floors start only when asked for, beside their pair.
    assert enabled_services(compose, ["gate", "floor"]) == GATE | {"inference-floor"}
    assert enabled_services(compose, ["demo", "demo-floor"]) == DEMO | {"demo-floor"}


def test_each_inference_service_runs_its_verify_mode() -> None:
    services = load_compose()["services"]
    modes = {name: s.get("environment", {}).get("KDTREE_VERIFY") for name, s in services.items()}
    assert modes["inference-baseline"] == "off"
    assert modes["inference-candidate"] == "on"
    assert modes["inference"] == "on"
    assert modes["demo-baseline"] == "off" and modes["demo-candidate"] == "on"
    # Only the baseline is forced deterministic; both sides of the gate get the same SGLang args.
    baseline = command_args(services["inference-baseline"])
    candidate = command_args(services["inference-candidate"])
    assert "--enable-deterministic-inference" in baseline
    assert "--enable-deterministic-inference" not in candidate
    assert [a for a in baseline if a != "--enable-deterministic-inference"] == candidate
    assert "--speculative-algorithm" in candidate and "--model-path" in candidate
    assert command_args(services["inference"]) == candidate
    # The A/A' floor: the candidate's arguments (kernel off) plus another KV split count.
    assert modes["inference-floor"] == "off" and modes["demo-floor"] == "off"
    floor = command_args(services["inference-floor"])
    assert floor == [*candidate, "--triton-attention-num-kv-splits", "16"]
    demo_floor = command_args(services["demo-floor"])
    assert demo_floor[-2:] == ["--attention-kv-splits", "3"]
    assert demo_floor[:-2] == command_args(services["demo-baseline"])
    # SGLang exports the kdtree_verify_* metrics (validate-mode differences, fallbacks) only with it.
    assert "--enable-metrics" in candidate
    serve = load_compose({"KDTREE_VERIFY": "validate"})["services"]["inference"]
    assert serve["environment"]["KDTREE_VERIFY"] == "validate"


def test_parity_waits_for_both_servers_to_be_healthy() -> None:
    services = load_compose()["services"]
    for sidecar, pair in {
        "parity": ("inference-baseline", "inference-candidate"),
        "demo-parity": ("demo-baseline", "demo-candidate"),
    }.items():
        depends = services[sidecar]["depends_on"]
        assert set(depends) == set(pair)
        assert all(d["condition"] == "service_healthy" for d in depends.values())
        assert all(services[name]["healthcheck"]["test"] for name in pair)
        args = command_args(services[sidecar])
        assert args[0] == "run"
        assert args[args.index("--baseline") + 1] == f"http://{pair[0]}:30000"
        assert args[args.index("--candidate") + 1] == f"http://{pair[1]}:30000"
        assert args[args.index("--out") + 1].startswith("/reports/")
    run_id = load_compose({"KDTREE_RUN_ID": "r1"})["services"]["parity"]
    assert command_args(run_id)[-1] == "/reports/r1"


def test_gpu_reservations_only_where_sglang_runs() -> None:
    env = {
        "KDTREE_BASELINE_GPUS": "2,3",
        "KDTREE_CANDIDATE_GPUS": "4,5",
        "KDTREE_GPUS": "6",
        "KDTREE_FLOOR_GPUS": "7",
    }
    services = load_compose(env)["services"]
    with_gpu = {name for name, s in services.items() if gpu_devices(s)}
    assert with_gpu == SGLANG_SERVICES
    ids = {name: gpu_devices(services[name])[0]["device_ids"] for name in sorted(with_gpu)}
    assert ids == {
        "inference": ["6"],
        "inference-baseline": ["2,3"],
        "inference-candidate": ["4,5"],
        "inference-floor": ["7"],
    }
    for name in SGLANG_SERVICES:
        service = services[name]
        assert service["ipc"] == "host"
        assert any(v.endswith(":/models:ro") for v in service["volumes"])
        assert gpu_devices(service)[0]["driver"] == "nvidia"
    for name in DEMO | {"parity"}:
        assert "deploy" not in services[name] and "ipc" not in services[name]


def test_ports_come_from_the_environment() -> None:
    env = {
        "KDTREE_BASELINE_PORT": "41001",
        "KDTREE_CANDIDATE_PORT": "41002",
        "KDTREE_PORT": "41000",
    }
    services = load_compose(env)["services"]
    assert services["inference-baseline"]["ports"] == ["127.0.0.1:41001:30000"]
    assert services["inference-candidate"]["ports"] == ["127.0.0.1:41002:30000"]
    assert services["inference"]["ports"] == ["127.0.0.1:41000:30000"]
    images = load_compose({"KDTREE_CANDIDATE_IMAGE": "reg/x:abc"})["services"]
    assert images["inference-candidate"]["image"] == "reg/x:abc"


def test_demo_profile_needs_no_gpu_and_no_model() -> None:
    services = load_compose()["services"]
    for name in DEMO | {"demo-floor"}:
        text = yaml.safe_dump(services[name])
        assert "nvidia" not in text and "/models" not in text
    assert {services[n]["build"]["target"] for n in DEMO} == {"demo", "parity"}


# --------------------------------------------------------------------------- Dockerfile


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    text = (ROOT / "Dockerfile").read_text()
    logical = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    )
    stages: dict[str, list[str]] = {}
    current = "__args__"
    for line in logical.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        match = re.match(r"FROM \S+ AS (\S+)", line, re.IGNORECASE)
        if match:
            current = match.group(1)
        stages.setdefault(current, []).append(line)
    return stages


def test_kernel_is_built_by_make_kernel_like_everywhere_else() -> None:
    stages = dockerfile_stages()
    runs = [line for line in stages["kernel-build"] if line.startswith("RUN ")]
    builds = [r for r in runs if re.search(r"(^|&& |RUN )(\w+=\S+ )*make kernel( |$|&&)", r)]
    assert builds, f"the kernel-build stage does not run `make kernel`: {runs}"
    assert not any("nvcc" in r or "setup.py" in r or "build_ext" in r for r in runs)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^kernel:", makefile, re.MULTILINE), "the Makefile has no kernel target"
    assert re.search(r"^## kernel: ", makefile, re.MULTILINE)
    # One build path: the target runs the module the op itself loads the extension with.
    recipe = re.search(r"^kernel:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe and "-m kdtree_verify._build" in recipe.group(1)
    build_module = (ROOT / "kernel" / "kdtree_verify" / "_build.py").read_text()
    assert "KDTREE_BUILD_DIR" in build_module and "KDTREE_BUILD_WITHOUT_GPU" in build_module
    # The archs the image builds by default are the ones the Makefile builds by default: one list,
    # kernel/kdtree_verify/cuda_archs.txt, that make hands to compose (the image's build argument)
    # and to promote (its --build-arg), and that _build reads; the Dockerfile and compose.yaml
    # hold none.
    archs_file = ROOT / "kernel" / "kdtree_verify" / "cuda_archs.txt"
    assert archs_file.read_text() == f"{DEFAULT_ARCHS}\n" and parse_archs(DEFAULT_ARCHS)
    assert "cuda_archs.txt" in makefile and "KDTREE_CUDA_ARCHS" in _kernel_build_sources()
    assert "ARG KDTREE_CUDA_ARCHS=" in stages["kernel-build"], "the build argument has no default"
    for path in ("Dockerfile", "compose.yaml"):
        assert DEFAULT_ARCHS not in (ROOT / path).read_text(), f"{path} keeps its own arch list"
    args = yaml.safe_load((ROOT / "compose.yaml").read_text())["x-build-inference"]["args"]
    assert args["KDTREE_CUDA_ARCHS"] == "${KDTREE_CUDA_ARCHS:-}"
    for target, command in (
        ("up", "docker compose up"),
        ("serve", "docker compose build"),
        ("promote", "kdtree_parity.promote"),
    ):
        recipe = _run("make", "-n", "-s", target, "COMPOSE=docker compose").stdout
        line = next(line for line in recipe.splitlines() if command in line)
        assert f'KDTREE_CUDA_ARCHS="{DEFAULT_ARCHS}"' in line, f"make {target}: {line}"


def _kernel_build_sources() -> str:
    paths = [*(ROOT / "kernel").glob("*.py"), *(ROOT / "kernel").glob("*.toml")]
    paths += (ROOT / "kernel" / "kdtree_verify").glob("*.py")
    return "\n".join(p.read_text() for p in paths)


def test_inference_image_contract() -> None:
    stages = dockerfile_stages()
    stage = "\n".join(stages["inference"])
    # One lineage: the CUDA base CUDA_SOURCE picks, torch and CUDA's libraries, then side by side
    # the kernel compiled against them and the rest of SGLang's set, the runtime on top with the
    # kernel's tar unpacked (the compiler stays: docs/operations.md says why).
    assert re.search(r"^FROM serving AS inference", stage, re.MULTILINE)
    assert stages["torch-runtime"][0] == "FROM cuda-python AS torch-runtime"
    assert stages["kernel-build"][0] == "FROM torch-runtime AS kernel-build"
    assert stages["serving"][0] == "FROM torch-runtime AS serving"
    assert stages["cuda-python"] == ["FROM cuda-from-${CUDA_SOURCE} AS cuda-python"]
    unpack = "--mount=type=bind,from=kernel-build,source=/opt/kdtree/kernel.tar"
    assert unpack in stage and "tar --extract" in stage
    # The loader in the runtime sees the archs and build directory the kernel was built with
    # (a different flag would make it recompile at run time).
    assert "ENV KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS}" in stage
    assert "KDTREE_BUILD_DIR=/opt/kdtree/kernel-build" in "\n".join(stages["torch-runtime"])
    args = "\n".join(stages["__args__"])
    assert "ARG CUDA_SOURCE=image" in args, "NVIDIA's base stays the default"
    assert stages["cuda-from-image"][0] == "FROM ${CUDA_BASE_IMAGE} AS cuda-from-image"
    assert stages["cuda-from-pypi"][0] == "FROM ${PYTHON_SLIM_IMAGE} AS cuda-from-pypi"
    cuda = re.search(r"ARG CUDA_VERSION=(\d+)\.(\d+)", args)
    assert cuda and (int(cuda.group(1)), int(cuda.group(2))) >= (12, 8)
    assert "nvidia/cuda:${CUDA_VERSION}-devel" in args
    # The wheels' toolkit is the release torch pins, and cpp_extension finds it through CUDA_HOME.
    pypi = "\n".join(stages["cuda-from-pypi"])
    assert "ARG CUDA_WHEELS_VERSION=13.0.3" in args
    assert '"cuda-toolkit[nvcc,crt,cccl,cudart]==${CUDA_WHEELS_VERSION}"' in pypi
    # ... and stays: the toolkit's wheels are requirements of SGLang's resolution (a fresh
    # resolution would otherwise take the newest nvcc, not the one torch's CUDA pins).
    assert "pip install -r /opt/kdtree/cuda-requirements.txt" in pypi
    assert ": >/opt/kdtree/cuda-requirements.txt" in "\n".join(stages["cuda-from-image"])
    assert "cat cuda-requirements.txt;" in "\n".join(stages["torch-runtime"])
    assert "CUDA_HOME=/opt/cuda" in pypi and "/opt/cuda/bin" in pypi
    assert 'ENTRYPOINT ["kdtree-serve"]' in stage
    assert "HEALTHCHECK" in stage and "/health" in stage
    for label in (
        "org.opencontainers.image.revision",
        "io.kdtree.sglang.version",
        "io.kdtree.torch.version",
        "io.kdtree.cuda.version",
        "io.kdtree.cuda.archs",
    ):
        assert label in stage
    build = "\n".join(stages["kernel-build"])
    # kdtree-verify is installed as a package (its wheel carries csrc), not as an editable checkout.
    assert "pip install --no-deps --no-build-isolation ./kernel" in build
    assert "--editable" not in build and " -e " not in build
    assert '"${KDTREE_BUILD_DIR}" "${site}"/kdtree_verify*' in build  # what the tar carries
    # Resolved once, then installed in slices of the pins, one layer each (none too big to commit).
    runtime = "\n".join(stages["torch-runtime"])
    serving = "\n".join(stages["serving"])
    assert re.search(
        r'"sglang==\$\{SGLANG_VERSION\}".* \| /opt/uv/bin/uv-pip compile - .*--output-file serving-pins.txt',
        runtime,
    )
    assert "--constraint serving-pins.txt --output-file kernel-build-pins.txt" in runtime
    # kdtree-inference's own pins join the resolution: installing it later changes nothing.
    assert "COPY services/inference/pyproject.toml kdtree-inference.pyproject.toml" in runtime
    assert "<kdtree-inference.pyproject.toml; }" in runtime
    slices = (runtime + serving).count("/opt/uv/bin/uv-pip install --no-deps")
    assert slices >= 5, slices
    assert "uv-pip install --no-deps -r serving-pins.txt" in serving
    # uv is a build tool: its stage is bind-mounted where it installs, and never copied.
    uv = "\n".join(stages["uv"])
    assert 'pip install --no-cache-dir --target /opt/uv "uv==${UV_VERSION}"' in uv
    assert "COPY scripts/uv_pip.sh /opt/uv/bin/uv-pip" in uv
    assert re.search(r"ARG UV_VERSION=\d+\.\d+\.\d+", args)
    mount = "--mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv"
    for name, lines in stages.items():
        for line in lines:
            assert "uv-pip" not in line or mount in line or name == "uv", (name, line)
            assert not re.match(r"COPY --from=uv\b", line), (name, line)
    assert "ARG SGLANG_VERSION=0.5.23" in args and "ARG TORCH_VERSION=2.14.1" in args


def test_stages_on_one_base_open_with_different_steps() -> None:
    """Stages built at the same time must not commit twin opening steps: a later build finding
    one twin misses the layers built on the other and rebuilds (from the network) from there."""
    stages = dockerfile_stages()
    on_python = [
        n for n, lines in stages.items() if lines[0].startswith("FROM ${PYTHON_SLIM_IMAGE}")
    ]
    assert set(on_python) == {"uv", "cuda-from-pypi", "parity", "demo"}
    openings = [stages[name][1] for name in on_python]
    assert len(set(openings)) == len(openings), dict(zip(on_python, openings, strict=True))


def test_each_revision_gets_its_own_labels() -> None:
    """podman 4 finds a cached LABEL step by its text alone: a RUN that takes VCS_REF (cached by
    its value) comes before each final stage's labels, or a revision inherits an earlier one's."""
    for name in ("inference", "parity", "demo"):
        lines = dockerfile_stages()[name]
        label = next(i for i, line in enumerate(lines) if line.startswith("LABEL "))
        assert "${VCS_REF}" in lines[label]
        runs = [line for line in lines[:label] if line.startswith("RUN ")]
        assert runs and "${VCS_REF}" in runs[-1], (name, runs[-1:])
        assert lines.index("ARG VCS_REF=unknown") < lines.index(runs[-1])


def test_every_final_stage_runs_as_a_non_root_user() -> None:
    for name in ("inference", "parity", "demo"):
        users = [line for line in dockerfile_stages()[name] if line.startswith("USER ")]
        assert users and users[-1] not in {"USER root", "USER 0"}, name


def test_parity_image_has_no_torch() -> None:
    stage = "\n".join(dockerfile_stages()["parity"])
    assert "torch" not in stage.lower() and "nvidia/cuda" not in stage
    assert 'ENTRYPOINT ["kdtree-parity"]' in stage
    dependencies = (ROOT / "services" / "parity" / "pyproject.toml").read_text()
    assert "torch" not in dependencies.split("dependencies")[1].split("]")[0]


def test_dockerignore_keeps_the_context_small_but_complete() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    for heavy in (".venv", ".git", "runs", "promotions", "models"):
        assert heavy in ignored or f"{heavy}/" in ignored, heavy
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    for sources in copied:
        for source in sources.split():
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
            assert source.rstrip("/") not in ignored


def test_make_runs_the_promotion_cli_from_the_venv() -> None:
    """promote reads the gate's report through its pydantic schema: the Makefile runs it with the
    venv's Python, where kdtree-parity and its dependencies are installed."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    for verb in ("promote", "rollback"):
        dry = subprocess.run(  # -n: print the recipe, run nothing
            ["make", "--no-print-directory", "-n", verb],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert dry.returncode == 0, dry.stderr
        assert f"/bin/python -m kdtree_parity.promote {verb}" in dry.stdout, dry.stdout
    result = subprocess.run(
        [sys.executable, "-m", "kdtree_parity.promote", "promote", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "--baseline-image" in result.stdout


def test_image_entrypoints_are_installed_console_scripts() -> None:
    stages = dockerfile_stages()
    scripts = {
        "inference": ("services/inference/pyproject.toml", "kdtree-serve"),
        "demo": ("services/inference/pyproject.toml", "kdtree-engine"),
        "parity": ("services/parity/pyproject.toml", "kdtree-parity"),
    }
    for stage, (pyproject, script) in scripts.items():
        assert f'ENTRYPOINT ["{script}"]' in stages[stage]
        project = (ROOT / pyproject).read_text()
        assert re.search(rf"^{script} = ", project.split("[project.scripts]")[1], re.M), script


# --------------------------------------------------------------------------- workflows


def _workflow(name: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    document["on"] = document.pop(True, document.get("on"))  # YAML 1.1 reads `on:` as true
    return document


def test_ci_workflow_runs_the_readme_test_command_on_every_push() -> None:
    workflow = _workflow("ci.yml")
    assert "push" in workflow["on"]
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert len([s for s in steps if "bash .ci/run" in s]) == 1
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert "scripts/container_ci.sh run make test" in ci_run


def test_parity_gate_workflow_gates_on_a_gpu_runner_and_keeps_the_report() -> None:
    workflow = _workflow("parity-gate.yml")
    assert "pull_request" in workflow["on"]
    [job] = workflow["jobs"].values()
    assert {"self-hosted", "gpu", "sm_120"} <= set(job["runs-on"])
    steps = job["steps"]
    gate = next(s for s in steps if "kdtree_parity.promote gate" in s.get("run", ""))
    assert "continue-on-error" not in gate and "|| true" not in gate["run"]
    # The CLI runs from a venv holding the parity package, installed by an earlier step.
    before = [s.get("run", "") for s in steps[: steps.index(gate)]]
    assert any('bin/pip" install --quiet ./services/parity' in run for run in before)
    assert gate["run"].startswith('"$RUNNER_TEMP/promote/bin/python" -m kdtree_parity.promote')
    after = steps[steps.index(gate) + 1 :]
    upload = next(s for s in after if s.get("uses", "").startswith("actions/upload-artifact@"))
    summary = next(s for s in after if "GITHUB_STEP_SUMMARY" in s.get("run", ""))
    assert upload["if"] == "always()" and summary["if"] == "always()"
    assert "report.md" in summary["run"]


# --------------------------------------------------------------------------- the real CLIs


def _parse(parser: argparse.ArgumentParser, args: list[str], who: str) -> argparse.Namespace:
    try:
        return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"{who} rejects {args}")


def _dockerfile_cmd(stage: str) -> list[str]:
    [cmd] = [line for line in dockerfile_stages()[stage] if line.startswith("CMD ")]
    return json.loads(cmd.removeprefix("CMD "))


def test_sglang_accepts_every_inference_command() -> None:
    """Compose's and the image's default arguments are real SGLang 0.5.23 server flags."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    services = load_compose()["services"]
    for name in sorted(SGLANG_SERVICES):
        args = _parse(parser, command_args(services[name]), f"SGLang ({name})")
        assert args.attention_backend == "triton" and args.model_path == "/models"
        assert args.speculative_algorithm == "EAGLE" and args.speculative_eagle_topk == 4
        assert args.enable_deterministic_inference == (name == "inference-baseline")
    _parse(parser, _dockerfile_cmd("inference"), "SGLang (the image's CMD)")


def test_reference_engine_accepts_the_demo_commands() -> None:
    from kdtree_inference.engine.server import build_parser, config_from_args

    services = load_compose()["services"]
    for args in (
        *(command_args(services[n]) for n in ("demo-baseline", "demo-candidate", "demo-floor")),
        _dockerfile_cmd("demo"),
    ):
        config_from_args(_parse(build_parser(), args, "kdtree-engine"))


def test_parity_cli_accepts_the_sidecar_commands() -> None:
    from kdtree_parity.cli import build_parser
    from kdtree_parity.corpus import load_corpus
    from kdtree_parity.policy import load_policy

    services = load_compose()["services"]
    for name in ("parity", "demo-parity"):
        args = _parse(build_parser(), command_args(services[name]), f"kdtree-parity ({name})")
        assert args.command == "run"
        assert (
            services[name]["environment"]["KDTREE_PARITY_FLOOR_URL"] == ""
        )  # no floor unless asked
        policy = load_policy(args.policy)
        assert len(load_corpus(args.corpus)) >= policy.policy.gate.min_prompts


def test_reports_go_to_a_named_volume_unless_a_directory_is_given() -> None:
    """Plain `up` must work as the image's non-root user; make and promote bind a host dir."""
    compose = load_compose()
    assert "kdtree-reports" in compose["volumes"]
    for name in ("parity", "demo-parity"):
        assert compose["services"][name]["volumes"] == ["kdtree-reports:/reports"]
        assert compose["services"][name]["user"] == "10001:10001"
    env = {"KDTREE_REPORTS_DIR": "/srv/reports", "KDTREE_PARITY_USER": "1000:1000"}
    bound = load_compose(env)["services"]["parity"]
    assert bound["volumes"] == ["/srv/reports:/reports"] and bound["user"] == "1000:1000"
    parity_stage = "\n".join(dockerfile_stages()["parity"])
    assert "mkdir -p /reports && chown kdtree /reports" in parity_stage


def test_the_production_service_never_builds() -> None:
    """`up --build` must never rebuild the checkout into the image production runs (stable)."""
    serve = load_compose({"KDTREE_SERVE_IMAGE": "kdtree/inference:stable"})["services"]["inference"]
    assert "build" not in serve and serve["image"] == "kdtree/inference:stable"


def test_make_kernel_in_the_image_does_not_rerun_setup(tmp_path: Path) -> None:
    """Replay the kernel-build stage's COPYs and its `touch .setup-done`, then ask make what
    `make kernel` would run: only the build, never scripts/setup_venv.sh (the image has no
    python3.11 and needs none of the dev tools)."""
    for line in dockerfile_stages()["kernel-build"]:
        if not line.startswith("COPY ") or "--from" in line:
            continue
        *sources, destination = line.split()[1:]
        for source in sources:
            src, dest = ROOT / source, tmp_path / destination
            if src.is_dir():
                shutil.copytree(src, dest, dirs_exist_ok=True)
            else:
                dest = dest / src.name if destination.endswith("/") else dest
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)

    def dry_run() -> str:
        command = ["make", "--no-print-directory", "-n", "kernel", f"VENV={venv}"]
        # Under `make test` the parent make's flags would leak in; this asks a top-level make.
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert "setup_venv.sh" in dry_run()  # without the marker make would run the whole setup
    (venv / ".setup-done").touch()
    assert dry_run() == f"{venv}/bin/python -m kdtree_verify._build"
