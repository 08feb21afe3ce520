"""The L2 read ceiling of this GPU: how fast all SMs together can read data that L2 holds.

Where many row tiles of the verify kernel share a request's KV (many heads x draft tokens), every
row tile reads each KV tile from L2, so the kernel moves 32 x more bytes from L2 into the SMs than
it reads from DRAM. This measures that ceiling with ``bench/kdtree_bench/kernel/csrc/l2_ceiling.cu`` (compiled with
nvcc like ``mma_ceiling.py``'s kernels): 16-byte L2-only loads from every SM over buffers of a few
MiB (L2 hits after a warm-up pass) up to one far larger than L2 (DRAM).

Usage (GPU machine): python -m kdtree_bench.kernel.l2_ceiling [--arch 90] [--out bench/results/l2_ceiling.json]
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

from kdtree_bench.kernel import mma_ceiling

SOURCE = Path(__file__).resolve().parent / "csrc" / "l2_ceiling.cu"
BUFFER_MIB = (4, 8, 16, 24, 32, 48, 1024)
READ_BYTES = 16 << 30
"""Bytes read per timed launch (the buffer is read as many times as it takes)."""


def load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    dll.l2_read_ms.restype = ctypes.c_float
    dll.l2_read_ms.argtypes = [ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return dll


def read_tbps(dll: ctypes.CDLL, buffer_bytes: int, blocks: int, threads: int = 256) -> float:
    """TB/s of reading a buffer of ``buffer_bytes``; a RuntimeError naming the CUDA error if it
    fails."""
    passes = max(1, READ_BYTES // buffer_bytes)
    ms = dll.l2_read_ms(buffer_bytes, passes, blocks, threads)
    if ms <= 0:
        raise RuntimeError(f"l2 ceiling: CUDA error {int(-ms)}")
    return buffer_bytes * passes / (ms * 1e-3) / 1e12


def measure(dll: ctypes.CDLL, sms: int) -> dict:
    """Read TB/s per buffer size (JSON-ready), 8 blocks of 256 threads per SM."""
    return {
        f"read_{mib}_MiB_TBps": round(read_tbps(dll, mib << 20, sms * 8), 2) for mib in BUFFER_MIB
    }


def measure_lib(lib: Path, props: Any) -> dict:
    return {
        "l2_MiB": round(props.L2_cache_size / 2**20, 1),
        **measure(load(lib), props.multi_processor_count),
    }


def main() -> int:
    return mma_ceiling.ceiling_cli("l2_ceiling", __doc__, SOURCE, measure_lib)


if __name__ == "__main__":
    sys.exit(main())
