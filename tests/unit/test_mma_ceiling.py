"""bench/mma_ceiling.py: the mma.sync ceiling kernels compile for the target archs without a GPU,
load through ctypes, and either measure (on a GPU) or fail with the CUDA error named (without)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import mma_ceiling


@pytest.mark.parametrize("arch", ["80", "90", "120"])
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
