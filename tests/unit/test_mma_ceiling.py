"""bench/kdtree_bench/kernel/mma_ceiling.py: the mma.sync ceiling kernels compile for the target archs without a GPU,
load through ctypes, and either measure (on a GPU) or fail with the CUDA error named (without)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from kdtree_bench.kernel import mma_ceiling
from kdtree_verify._build import DEFAULT_ARCHS, parse_archs
from kdtree_verify._sass import find_cuobjdump


@pytest.mark.parametrize("arch", parse_archs(DEFAULT_ARCHS))
def test_builds_and_loads_for_each_arch(arch: str, tmp_path: Path) -> None:
    dll = mma_ceiling.load(mma_ceiling.build(arch, tmp_path))
    assert dll.mma_ceiling_mmas_per_warp(0, 1000) == 8 * 1000


def test_measures_on_a_gpu_or_names_the_cuda_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        dll = mma_ceiling.load(mma_ceiling.build(f"{props.major}{props.minor}", tmp_path))
        assert mma_ceiling.tflops(dll, "registers", props.multi_processor_count, 256, 100, 1) > 0
    else:
        dll = mma_ceiling.load(mma_ceiling.build("90", tmp_path))
        with pytest.raises(RuntimeError, match=r"CUDA error \d+"):
            mma_ceiling.tflops(dll, "registers", 1, 256, 10, 1)


def test_fp8_mma_sync_is_native_on_sm120_and_lowered_to_fp16_hmma_on_sm90(tmp_path: Path) -> None:
    # The fact docs/kernel-fp8.md rests on: sm_90 has no fp8 mma.sync (ptxas unpacks e4m3 to fp16
    # and issues HMMA.16816), while sm_120 issues QMMA.16832 at the fp8 rate.
    cuobjdump = find_cuobjdump()
    for arch, native in (("90", False), ("120", True)):
        lib = mma_ceiling.build(arch, tmp_path)
        sass = subprocess.run(
            [cuobjdump, "-sass", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        fp8 = sass[sass.index("mma_registers_fp8") :].split("Function :")[0]
        assert ("QMMA.16832.F32.E4M3.E4M3" in fp8) == native, arch
        assert ("F2FP.F16.E4M3.UNPACK" in fp8) == (not native), arch


def test_the_fp8_variant_is_reported_apart_from_the_bf16_ceiling(tmp_path: Path) -> None:
    # kernel_bench.py divides by max(measure(...)): the fp8 rate must never enter it.
    dll = mma_ceiling.load(mma_ceiling.build("90", tmp_path))
    assert dll.mma_ceiling_mmas_per_warp(2, 1000) == 8 * 1000
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lib = mma_ceiling.build(f"{props.major}{props.minor}", tmp_path)
        bf16 = mma_ceiling.measure(mma_ceiling.load(lib), props.multi_processor_count, 100, 1)
        assert bf16 and not any("fp8" in key for key in bf16)
        if mma_ceiling.has_fp8_mma(props.major, props.minor):
            assert mma_ceiling.tflops(mma_ceiling.load(lib), "registers_fp8", 1, 256, 100, 1) > 0
        else:  # sm_80 has none, sm_90 only an emulation: refused, never timed
            with pytest.raises(RuntimeError, match=r"CUDA error \d+"):
                mma_ceiling.tflops(mma_ceiling.load(lib), "registers_fp8", 1, 256, 10, 1)
    else:
        with pytest.raises(RuntimeError, match=r"CUDA error \d+"):
            mma_ceiling.tflops(dll, "registers_fp8", 1, 256, 10, 1)


@pytest.mark.parametrize(
    ("major", "minor", "native"),
    [(8, 0, False), (8, 6, False), (8, 9, True), (9, 0, False), (10, 0, True), (12, 0, True)],
)
def test_fp8_mma_is_timed_only_where_it_is_in_hardware(
    major: int, minor: int, native: bool
) -> None:
    assert mma_ceiling.has_fp8_mma(major, minor) == native
