"""CI check of the CUDA kernel without a GPU: compile the device code for sm_80, sm_90 and sm_120
with ``ptxas -v`` (nvcc 13 is on the CI machine) and hold the report to the rules: no spills, no
local-memory stack frame in the attention kernel, registers that fit the launch, and at most
101,376 bytes of shared memory per block on sm_120. Also: the committed summary in
bench/results/ptxas_summary.json is the report of the current source, and the build's arch
configuration parses and refuses bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdtree_verify import _build, _ptxas

REPO = Path(__file__).resolve().parents[2]
ARCHS = _build.parse_archs(_build.DEFAULT_ARCHS)  # kernel/kdtree_verify/cuda_archs.txt
KERNELS = {
    "plan_kernel",
    "attention_kernel<bf16>",
    "attention_kernel<fp16>",
    "attention_kernel<bf16,fp8kv>",  # an fp8 (float8_e4m3fn) KV pool
    "attention_kernel<fp16,fp8kv>",
    # the fp8 pool with SGLang's roundings, and its row-max pass
    "attention_kernel<bf16,fp8kv,triton>",
    "attention_kernel<fp16,fp8kv,triton>",
    "attention_kernel<bf16,fp8kv,triton_rowmax>",
    "attention_kernel<fp16,fp8kv,triton_rowmax>",
    # the combine in both batch sizes (kCombineBatchNarrow, kCombineBatchWide); the host picks one
    "combine_kernel<bf16,4>",
    "combine_kernel<fp16,4>",
    "combine_kernel<bf16,9>",
    "combine_kernel<fp16,9>",
}


@pytest.fixture(scope="module")
def ptxas_check() -> tuple[list[_ptxas.KernelReport], list[str]]:
    return _ptxas.check(ARCHS)


def test_every_kernel_compiles_for_every_arch(ptxas_check) -> None:
    reports, _ = ptxas_check
    compiled = {(r.arch, r.kernel) for r in reports}
    assert compiled == {(f"sm_{a}", k) for a in ARCHS for k in KERNELS}


def test_ptxas_report_is_clean(ptxas_check) -> None:
    reports, found = ptxas_check
    assert found == [], "\n".join(found)
    for r in reports:
        assert r.spill_stores == 0 and r.spill_loads == 0, r


def test_sm120_shared_memory_fits_one_block(ptxas_check) -> None:
    reports, _ = ptxas_check
    attention = [r for r in reports if r.arch == "sm_120" and r.kernel.startswith("attention")]
    assert attention, "no sm_120 attention kernel in the report"
    for r in attention:
        assert 0 < r.dynamic_smem <= r.smem_per_block <= _ptxas.SM120_SMEM_LIMIT, r


def test_committed_summary_is_the_current_report(ptxas_check) -> None:
    reports, _ = ptxas_check
    committed = json.loads((REPO / "bench/results/ptxas_summary.json").read_text())
    assert committed["problems"] == []
    fresh = {(r.arch, r.kernel): (r.registers, r.smem_per_block) for r in reports}
    saved = {
        (k["arch"], k["kernel"]): (k["registers"], k["smem_per_block"])
        for k in committed["kernels"]
    }
    assert saved == fresh, "rerun `make ptxas` and commit bench/results/ptxas_summary.json"


def test_checker_flags_spills_stack_and_oversized_smem() -> None:
    """The rules can fail: a synthetic report with every violation is caught."""
    text = (
        "ptxas info    : Compiling entry function '_Z16attention_kernelI13__nv_bfloat16E' "
        "for 'sm_120'\n"
        "ptxas info    : Function properties for x\n"
        "    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 16 barriers, 4096 bytes smem\n"
    )
    reports = _ptxas.parse_report(text, {"smem": 100_000, "threads": 512, "combine_threads": 256})
    assert len(reports) == 1 and reports[0].smem_per_block == 104_096
    found = " ".join(_ptxas.problems(reports))
    for needle in ("spills", "stack frame", "registers", "shared memory"):
        assert needle in found


def test_short_names_keep_template_arguments_apart() -> None:
    """Two instantiations of one kernel get two names, so each is checked and summarized."""
    prefix = "_ZN6kdtree49_GLOBAL__N__9fca35cc_16_verify_kernel_cu_26b57768"
    names = [
        ("14combine_kernelI13__nv_bfloat16Li4EEEvNS_12VerifyParamsE", "combine_kernel<bf16,4>"),
        ("14combine_kernelI6__halfLi9EEEvNS_12VerifyParamsE", "combine_kernel<fp16,9>"),
        ("16attention_kernelI13__nv_bfloat16Lb0EEEvNS_12VerifyParamsE", "attention_kernel<bf16>"),
        ("16attention_kernelI6__halfLb1EEEvNS_12VerifyParamsE", "attention_kernel<fp16,fp8kv>"),
        ("11plan_kernelENS_12VerifyParamsE", "plan_kernel"),
    ]
    for mangled, short in names:
        assert _ptxas.short_name(prefix + mangled) == short, mangled


def test_arch_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KDTREE_CUDA_ARCHS", raising=False)
    assert _build.cuda_archs() == ARCHS
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", "90")
    assert _build.gencode_flags(_build.cuda_archs()) == ["-gencode=arch=compute_90,code=sm_90"]
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", "sm_90")
    with pytest.raises(ValueError, match="KDTREE_CUDA_ARCHS"):
        _build.cuda_archs()


def test_make_kernel_compiles_and_links_the_extension_without_a_gpu(tmp_path: Path) -> None:
    """`make kernel` (the command the Dockerfile runs) builds the full torch extension for sm_80,
    sm_90 and sm_120 on a machine with nvcc but no GPU, and the module it links imports and
    exposes the launchers the Python layer calls."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "KDTREE_BUILD_WITHOUT_GPU": "1",
        "KDTREE_BUILD_DIR": str(tmp_path),
        "KDTREE_CUDA_ARCHS": ";".join(ARCHS),
    }
    build = subprocess.run(
        ["make", "-s", "kernel"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    built = list(tmp_path.glob(f"{_build.EXTENSION_NAME}*.so"))
    assert len(built) == 1, list(tmp_path.iterdir())
    probe = (
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location({_build.EXTENSION_NAME!r}, sys.argv[1])\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(sorted(n for n in ('plan', 'attend', 'ctas_per_sm') if hasattr(m, n)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe, str(built[0])], capture_output=True, text=True, timeout=120
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.strip() == "['attend', 'ctas_per_sm', 'plan']"
