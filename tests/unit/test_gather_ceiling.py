"""bench/kdtree_bench/kernel/gather_ceiling.py: the KV-row gather kernel compiles for the target archs without a GPU
(the bulk-copy methods from sm_90 on), loads through ctypes, and either measures (on a GPU) or
fails with the CUDA error named (without)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from kdtree_bench.kernel import gather_ceiling, mma_ceiling
from kdtree_verify._sass import find_cuobjdump


def test_builds_and_loads_for_each_arch_with_bulk_copies_from_sm90(tmp_path: Path) -> None:
    # An sm_80 build compiles the bulk copies out; sm_90 and sm_120 must carry them (UBLKCP), and
    # every build carries the cp.async path (LDGSTS).
    cuobjdump = find_cuobjdump()
    for arch, has_bulk in (("80", False), ("90", True), ("120", True)):
        lib = mma_ceiling.build(arch, tmp_path, source=gather_ceiling.SOURCE)
        sass = subprocess.run(
            [cuobjdump, "-sass", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        assert gather_ceiling.load(lib).gather_ms is not None
        assert "LDGSTS" in sass, arch
        assert ("UBLKCP" in sass) == has_bulk, arch


def test_measures_on_a_gpu_or_names_the_cuda_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        dll = gather_ceiling.load(
            mma_ceiling.build(f"{props.major}{props.minor}", tmp_path, source=gather_ceiling.SOURCE)
        )
        got = gather_ceiling.gather(dll, 4096, props.multi_processor_count, method=0, stages=2)
        assert got["cycles_per_tile"] > 0 and got["GBps"] > 0
    else:
        dll = gather_ceiling.load(mma_ceiling.build("90", tmp_path, source=gather_ceiling.SOURCE))
        with pytest.raises(RuntimeError, match=r"CUDA error \d+"):
            gather_ceiling.gather(dll, 4096, 1, method=0, stages=2)
