"""The gather ceiling: SM cycles per 32-row KV tile when one CTA per SM does nothing but gather.

The verify kernel reads its prefix through ``kv_indices``: every 32-token tile is 32 rows of
1152 B picked from the pool. ``bench/kdtree_bench/kernel/csrc/gather_ceiling.cu`` (compiled with nvcc like
``mma_ceiling.py``'s kernels) times that gather alone, one CTA of 256 threads per SM, for three
issue methods: ``cp.async`` by all threads (the kernel's way), one ``cp.async.bulk`` per row by the
32 lanes of one warp, and the same 32 bulk copies from one thread; each with a 2- and a 4-stage
ring, over a pool that L2 holds and one far larger than L2. Rows are random, as in a fragmented
pool. The bulk copies need sm_90 or later (sm_120 included); on sm_80 only ``cp.async`` is timed.

Usage (GPU machine): python -m kdtree_bench.kernel.gather_ceiling [--arch 90] [--out gather_ceiling.json]
"""

from __future__ import annotations

import ctypes
import statistics
import sys
from pathlib import Path
from typing import Any

from kdtree_bench.kernel import mma_ceiling

SOURCE = Path(__file__).resolve().parent / "csrc" / "gather_ceiling.cu"
METHODS = {0: "cp_async_all_threads", 1: "bulk_per_row_one_warp", 2: "bulk_per_row_one_thread"}
STAGES = (2, 4)
POOLS = {"l2": 16_384, "dram": 262_144}
"""Pool rows: 18.9 MB (held by an H200's L2 after the warm-up launch) and 302 MB."""
TILES = 256
ROWS = 32
TILE_BYTES = ROWS * 1152


def load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    dll.gather_ms.restype = ctypes.c_float
    dll.gather_ms.argtypes = [
        ctypes.c_longlong,
        ctypes.POINTER(ctypes.c_int32),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_longlong),
    ]
    return dll


def gather(dll: ctypes.CDLL, pool_rows: int, blocks: int, method: int, stages: int) -> dict:
    """One timed launch: median SM cycles per tile over the CTAs, and all SMs' GB/s together; a
    RuntimeError naming the CUDA error if it fails."""
    import torch

    gen = torch.Generator().manual_seed(pool_rows + 7 * method + stages)
    idx = torch.randint(0, pool_rows, (blocks * TILES * ROWS,), generator=gen, dtype=torch.int32)
    cycles = (ctypes.c_longlong * blocks)()
    ms = dll.gather_ms(
        pool_rows,
        ctypes.cast(idx.data_ptr(), ctypes.POINTER(ctypes.c_int32)),
        blocks,
        TILES,
        method,
        stages,
        cycles,
    )
    if ms <= 0:
        raise RuntimeError(f"gather ceiling: CUDA error {int(-ms)}")
    return {
        "cycles_per_tile": round(statistics.median(cycles) / TILES, 1),
        "GBps": round(blocks * TILES * TILE_BYTES / (ms * 1e-3) / 1e9, 1),
    }


def measure_lib(lib: Path, props: Any) -> dict:
    dll = load(lib)
    sms = props.multi_processor_count
    methods = [m for m in METHODS if m == 0 or props.major >= 9]
    return {
        "tile_bytes": TILE_BYTES,
        "tiles_per_cta": TILES,
        **{
            f"{pool}_{METHODS[m]}_{s}_stages": gather(dll, rows, sms, m, s)
            for pool, rows in POOLS.items()
            for s in STAGES
            for m in methods
        },
    }


def main() -> int:
    return mma_ceiling.ceiling_cli("gather_ceiling", __doc__, SOURCE, measure_lib)


if __name__ == "__main__":
    sys.exit(main())
