"""bench/kdtree_bench/kernel/l2_ceiling.py: the L2 read kernel compiles for the target archs without a GPU, loads
through ctypes, and either measures (on a GPU) or fails with the CUDA error named (without)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdtree_bench.kernel import l2_ceiling, mma_ceiling
from kdtree_verify._build import DEFAULT_ARCHS, parse_archs


@pytest.mark.parametrize("arch", parse_archs(DEFAULT_ARCHS))
def test_builds_and_loads_for_each_arch(arch: str, tmp_path: Path) -> None:
    lib = mma_ceiling.build(arch, tmp_path, source=l2_ceiling.SOURCE)
    assert lib.name == f"l2_ceiling_sm{arch}.so"
    assert l2_ceiling.load(lib).l2_read_ms is not None


def test_measures_on_a_gpu_or_names_the_cuda_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lib = mma_ceiling.build(f"{props.major}{props.minor}", tmp_path, source=l2_ceiling.SOURCE)
        assert l2_ceiling.read_tbps(l2_ceiling.load(lib), 4 << 20, props.multi_processor_count) > 0
    else:
        dll = l2_ceiling.load(mma_ceiling.build("90", tmp_path, source=l2_ceiling.SOURCE))
        with pytest.raises(RuntimeError, match=r"CUDA error \d+"):
            l2_ceiling.read_tbps(dll, 4 << 20, 1)
