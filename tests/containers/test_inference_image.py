"""The inference image CI built (localhost/kdtree/inference:latest in podman's storage, Dockerfile
target `inference`, CUDA from pip's index), inspected and run with podman, without a GPU: the kernel's machine code for every arch, SGLang
0.5.23 and the plugin inside it, the entrypoint's refusals, the labels, and the push to the local
registry whose digest CI recorded (KDTREE_CI_INFERENCE_RECORD, written by
scripts/container_ci.sh).

What needs a GPU (serving, the self-check's cases, the gate) is not run here:
tests/gpu/test_selfcheck_gpu.py and the parity-gate workflow cover those on a GPU host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from container_support import INFERENCE_IMAGE, ROOT, inspect, missing, podman
from packaging.version import Version

from kdtree_verify._build import DEFAULT_ARCHS, parse_archs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("inference_image")]
ARCHS = {f"sm_{a}" for a in parse_archs(DEFAULT_ARCHS)}  # kernel/kdtree_verify/cuda_archs.txt
EXTENSION = "/opt/kdtree/kernel-build/kdtree_verify_cuda.so"
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)


def in_image(
    *command: str, entrypoint: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """A throwaway container of the image, no network, as the image's user."""
    flags = ["--rm", "--network", "none"]
    for name, value in (env or {}).items():
        flags += ["--env", f"{name}={value}"]
    if entrypoint is not None:
        flags += ["--entrypoint", entrypoint]
    # podman's own errors (no systemd here to time the image's HEALTHCHECK) would otherwise be
    # mixed into the container's stderr, which the refusal tests read line by line.
    return podman(
        "--log-level", "fatal", "run", *flags, INFERENCE_IMAGE, *command, check=False, timeout=900
    )


def image_facts(template: str) -> Any:
    return inspect(INFERENCE_IMAGE, template, engine="podman")


def python_in_image(script: str, **env: str) -> dict[str, Any]:
    result = in_image("-c", textwrap.dedent(script), entrypoint="python", env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def elf_archs(listing: str) -> set[str]:
    """The sm_XX of every ELF `cuobjdump --list-elf` names (lines like
    `ELF file    3: verify_kernel.sm_120.cubin`)."""
    return set(re.findall(r"\.(sm_\d+a?)\.cubin", listing))


def test_elf_archs_parses_cuobjdumps_listing() -> None:
    # cuobjdump 13.2's listing of the extension as `make kernel` builds it (80;90;120).
    listing = (
        "ELF file    1: verify_kernel.sm_80.cubin\n"
        "ELF file    2: verify_kernel.sm_90.cubin\n"
        "ELF file    3: verify_kernel.sm_120.cubin\n"
    )
    assert elf_archs(listing) == {"sm_80", "sm_90", "sm_120"}
    assert "sm_120" not in elf_archs(listing.replace("sm_120", "sm_89"))


def test_the_extension_carries_machine_code_for_every_arch() -> None:
    result = in_image("--list-elf", EXTENSION, entrypoint="cuobjdump")
    assert result.returncode == 0, result.stderr[-4000:]
    found = elf_archs(result.stdout)
    assert "sm_120" in found, f"no sm_120 code in the extension: {result.stdout}"
    assert found >= ARCHS, f"cuobjdump --list-elf lists {sorted(found)}: {result.stdout}"
    labels = image_facts(".Config.Labels")
    assert {f"sm_{a}" for a in labels["io.kdtree.cuda.archs"].split(";")} == found


def test_the_extension_loads_as_built_from_the_installed_package() -> None:
    """kdtree_verify is a real install (no checkout in the image) and the op's loader finds the
    extension built in the image up to date: ninja has nothing to do, the module is the one on
    disk, unchanged. Without a GPU the load itself needs KDTREE_BUILD_WITHOUT_GPU=1."""
    facts = python_in_image(
        """
        import contextlib, io, json, os
        from pathlib import Path
        import kdtree_verify
        from kdtree_verify import _build
        so = Path(os.environ["KDTREE_BUILD_DIR"]) / "kdtree_verify_cuda.so"
        before = so.stat().st_mtime_ns
        log = io.StringIO()
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            module = _build.load(verbose=True)
        print(json.dumps({
            "package": kdtree_verify.__file__, "csrc": str(_build.CSRC_DIR),
            "in_checkout": _build.IN_CHECKOUT, "module": module.__file__,
            "unchanged": so.stat().st_mtime_ns == before, "log": log.getvalue(),
            "checkout_exists": Path("/opt/kdtree/kernel").exists(),
        }))
        """,
        KDTREE_BUILD_WITHOUT_GPU="1",
    )
    assert "/site-packages/kdtree_verify/" in facts["package"], facts
    assert facts["csrc"].endswith("/site-packages/kdtree_verify/csrc")
    assert facts["in_checkout"] is False and facts["checkout_exists"] is False
    assert facts["module"] == EXTENSION
    assert facts["unchanged"], f"the loader rebuilt the extension: {facts['log']}"


def test_sglang_imports_and_the_plugin_builds_the_backend_on_sglangs_modules() -> None:
    facts = python_in_image(
        """
        import json
        from importlib.metadata import entry_points, version
        import sglang
        from prometheus_client import CollectorRegistry
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
        [plugin] = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "kdtree_verify"]
        register = plugin.load()
        from kdtree_inference.sglang import testing
        from kdtree_inference.sglang.backend import KdtreeTritonAttnBackend
        from kdtree_inference.sglang.modes import VerifySettings
        with testing.sglang_cpu_context():
            runner = testing.make_model_runner(num_heads=2, num_draft=3)
            backend = testing.make_backend(
                KdtreeTritonAttnBackend, runner,
                kdtree_settings=VerifySettings.from_env({"KDTREE_VERIFY": "off"}),
                kdtree_registry=CollectorRegistry(),
            )
        print(json.dumps({
            "sglang": sglang.__version__, "dist": version("sglang"),
            "plugin": f"{register.__module__}:{register.__qualname__}",
            "backend_mro": [c.__module__ + "." + c.__qualname__ for c in type(backend).__mro__],
            "is_triton": isinstance(backend, TritonAttnBackend),
            "pool": type(runner.token_to_kv_pool).__module__,
        }))
        """,
        TRITON_INTERPRET="1",
    )
    assert facts["sglang"] == facts["dist"] == "0.5.23"
    assert facts["plugin"] == "kdtree_inference.sglang.plugin:register"
    assert facts["is_triton"], facts
    assert facts["backend_mro"][0] == "kdtree_inference.sglang.backend.KdtreeTritonAttnBackend"
    assert "sglang.srt.layers.attention.triton_backend.TritonAttnBackend" in facts["backend_mro"]
    assert facts["pool"] == "sglang.srt.mem_cache.memory_pool"


# Committing a layer takes about four times its size on disk at once (docs/operations.md, "Disk"):
# SGLang's install as one ~11.5 GB layer needed ~45 GB and filled the disk. The serving stage
# installs it in slices; none may grow back past this.
LARGEST_LAYER_BYTES = 6 * 10**9


def test_no_layer_is_too_big_to_commit_on_cis_disk() -> None:
    history = json.loads(podman("history", "--format", "json", INFERENCE_IMAGE).stdout)
    sizes = sorted(((step["size"], step["CreatedBy"][-120:]) for step in history), reverse=True)
    assert sum(size for size, _ in sizes) > 8 * 10**9, sizes  # SGLang's whole set is in there
    largest, created_by = sizes[0]
    assert largest < LARGEST_LAYER_BYTES, f"a {largest / 1e9:.1f} GB layer: {created_by}"


def test_the_sliced_install_is_sglangs_whole_resolved_set() -> None:
    """Each slice installs with --no-deps: pip check proves nothing of SGLang's dependency set was
    left out, and every pin pip resolved is what is installed."""
    facts = python_in_image(
        """
        import json, subprocess
        from importlib.metadata import version
        import importlib.util, shutil
        pins = [line.split("==") for line in open("/opt/kdtree/serving-pins.txt").read().split()]
        check = subprocess.run(["python", "-m", "pip", "check"], capture_output=True, text=True)
        print(json.dumps({
            "pins": len(pins),
            "differ": [f"{n}=={v} but {version(n)}" for n, v in pins if version(n) != v],
            "check": check.returncode, "out": check.stdout + check.stderr,
            "uv": [shutil.which("uv"), shutil.which("uv-pip"), importlib.util.find_spec("uv")],
        }))
        """
    )
    assert facts["pins"] > 150, facts
    assert facts["differ"] == [], facts
    assert facts["check"] == 0, facts["out"]
    assert facts["uv"] == [None, None, None], "the build's installer stayed in the image"


def test_kdtree_serve_help_is_sglangs() -> None:
    result = in_image("--help")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "--speculative-algorithm" in result.stdout and "--attention-backend" in result.stdout
    assert "kdtree-serve: mode: KDTREE_VERIFY=on" in result.stderr


def test_kernel_mode_without_a_gpu_refuses_with_the_reason() -> None:
    result = in_image(
        "--model-path", "/models", "--attention-backend", "triton", env={"KDTREE_VERIFY": "on"}
    )
    assert result.returncode == 2, result.stderr[-4000:]
    assert "refusing to start with KDTREE_VERIFY=on: no CUDA device is visible" in result.stderr
    assert "Traceback" not in result.stderr and "exec " not in result.stderr


def test_selfcheck_without_a_gpu_refuses_in_one_line() -> None:
    for command, entrypoint in (([], "kdtree-selfcheck"), (["kdtree-selfcheck"], None)):
        result = in_image(*command, entrypoint=entrypoint)
        assert result.returncode == 2, result.stderr[-4000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "refused: no CUDA device is visible" in lines[0], lines


def test_labels_name_the_revision_and_the_versions_inside() -> None:
    labels = image_facts(".Config.Labels")
    revision = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.revision"] == revision
    assert labels["io.kdtree.cuda.archs"] == DEFAULT_ARCHS
    inside = python_in_image(
        """
        import json, re, subprocess
        from importlib.metadata import version
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        print(json.dumps({
            "sglang": version("sglang"), "torch": version("torch"),
            "cuda": version("cuda-toolkit"), "nvcc": re.search(r"release ([\\d.]+)", nvcc).group(1),
        }))
        """
    )
    assert labels["io.kdtree.sglang.version"] == inside["sglang"] == "0.5.23"
    assert labels["io.kdtree.torch.version"] == inside["torch"] == "2.14.1"
    # cuda-toolkit's metadata spells its release 13.0.3.0; the label has the pin, 13.0.3.
    assert Version(labels["io.kdtree.cuda.version"]) == Version(inside["cuda"])
    assert labels["io.kdtree.cuda.version"].startswith(inside["nvcc"] + ".")
    assert labels["io.kdtree.cuda.source"] == "pypi"


def _record() -> dict[str, Any]:
    path = os.environ.get("KDTREE_CI_INFERENCE_RECORD", "")
    if not path or not Path(path).is_file():
        missing("KDTREE_CI_INFERENCE_RECORD names no record of the inference image's push")
    return json.loads(Path(path).read_text())


def test_the_pushed_digest_ci_recorded_is_the_registrys(registry: str) -> None:
    record = _record()
    repository, tag = record["ref"].rsplit(":", 1)
    assert repository == f"{registry}/kdtree/inference"
    request = urllib.request.Request(
        f"http://{registry}/v2/kdtree/inference/manifests/{tag}",
        method="HEAD",
        headers={"Accept": MANIFEST_TYPES},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        served = response.headers["Docker-Content-Digest"]
    assert record["repo_digest"] == f"{repository}@{served}"
    # podman 4's templates spell it .ID (json .Id fails there).
    assert record["image_id"] == "sha256:" + image_facts(".ID")
    # The manifest the registry serves under that digest names this image's config (its id).
    request = urllib.request.Request(
        f"http://{registry}/v2/kdtree/inference/manifests/{served}",
        headers={"Accept": MANIFEST_TYPES},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest = json.loads(response.read())
    assert manifest["config"]["digest"] == record["image_id"]
