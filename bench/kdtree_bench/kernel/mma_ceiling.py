"""The mma.sync ceiling of this GPU: what sm_80-level tensor-core code can reach at all.

The verify kernel may use only mma.sync (the same code must run on sm_120, which has no wgmma), so
its roofline efficiency against cuBLAS's wgmma matmul rate mixes two things: how far the kernel is
from what mma.sync allows, and how far mma.sync is from wgmma. This measures the first ceiling with
``bench/kdtree_bench/kernel/csrc/mma_ceiling.cu`` (compiled with nvcc into a small shared library, called via ctypes):

- ``registers``: HMMA m16n8k16 bf16/fp32 from register fragments, 8 independent accumulators per
  warp, at two occupancies: 8 warps per SM (the verify kernel's) and 32 warps per SM;
- ``ldmatrix``: each ldmatrix.x4 from shared memory feeding 4 MMAs, as the kernel's main loop does;
- ``registers_fp8`` (reported apart, where fp8 mma.sync is in hardware: sm_89, sm_100 and later,
  sm_120 included; sm_90 only emulates it): ``registers`` with m16n8k32 e4m3 operands, the rate
  an fp8-operand kernel could reach with mma.sync. It is not part of the bf16 ceiling that
  ``kernel_bench.py`` divides by.

Usage (GPU machine): python -m kdtree_bench.kernel.mma_ceiling [--arch 90] [--out bench/results/mma_ceiling.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "csrc" / "mma_ceiling.cu"
KERNEL_CSRC = Path(__file__).resolve().parents[3] / "kernel" / "csrc"  # mma_sm80.h
FLOP_PER_MMA = 2 * 16 * 8 * 16
VARIANTS = {"registers": 0, "ldmatrix": 1}
FP8_VARIANTS = {"registers_fp8": 2}
FLOP_PER_FP8_MMA = 2 * 16 * 8 * 32


def build(arch: str, out_dir: Path, source: Path = SOURCE) -> Path:
    """Compile ``source`` (default: the mma.sync ceiling kernels) for sm_<arch> into a shared
    library (no GPU needed)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc not found on PATH: the ceiling kernels are compiled at run time")
    lib = out_dir / f"{source.stem}_sm{arch}.so"
    cmd = [
        nvcc,
        "-O3",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        f"-I{KERNEL_CSRC}",
        str(source),
        "-o",
        str(lib),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed for sm_{arch}:\n{done.stderr}")
    return lib


def load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    dll.mma_ceiling_ms.restype = ctypes.c_float
    dll.mma_ceiling_ms.argtypes = [ctypes.c_int] * 5
    dll.mma_ceiling_mmas_per_warp.restype = ctypes.c_longlong
    dll.mma_ceiling_mmas_per_warp.argtypes = [ctypes.c_int, ctypes.c_int]
    return dll


def tflops(
    dll: ctypes.CDLL, variant: str, blocks: int, threads: int, iters: int, reps: int
) -> float:
    """TFLOP/s of one configuration; RuntimeError with the CUDA error code if it cannot run."""
    code = {**VARIANTS, **FP8_VARIANTS}[variant]
    ms = dll.mma_ceiling_ms(code, blocks, threads, iters, reps)
    if ms <= 0:
        raise RuntimeError(f"mma ceiling ({variant}): CUDA error {int(-ms)}")
    mmas = dll.mma_ceiling_mmas_per_warp(code, iters) * blocks * (threads // 32)
    flop = FLOP_PER_FP8_MMA if variant in FP8_VARIANTS else FLOP_PER_MMA
    return mmas * flop / (ms * 1e-3) / 1e12


def measure(
    dll: ctypes.CDLL, sms: int, iters: int = 20_000, reps: int = 5, variants: dict | None = None
) -> dict:
    """The ceilings as a JSON-ready dict (TFLOP/s), each variant at 8 and 32 warps per SM (the
    bf16 variants unless ``variants`` names others)."""
    result = {}
    for variant in variants or VARIANTS:
        for warps_per_sm in (8, 32):
            blocks = sms * warps_per_sm // 8  # 256-thread blocks, all resident at once
            key = f"mma_sync_{variant}_{warps_per_sm}_warps_per_sm_TFLOPs"
            result[key] = round(tflops(dll, variant, blocks, 256, iters, reps), 1)
    return result


def has_fp8_mma(major: int, minor: int) -> bool:
    """Whether mma.sync m16n8k32 e4m3 runs in hardware (sm_89, sm_100 and later; sm_90 emulates
    it with fp16 HMMA and separate adds)."""
    return (major, minor) >= (8, 9) and major != 9


def measure_all(lib: Path, props: Any) -> dict:
    """The bf16 ceilings, and the fp8 one where the GPU has fp8 mma.sync in hardware."""
    dll = load(lib)
    result = measure(dll, props.multi_processor_count)
    if has_fp8_mma(props.major, props.minor):
        result.update(measure(dll, props.multi_processor_count, variants=FP8_VARIANTS))
    return result


def ceiling_cli(tool: str, doc: str, source: Path, measure_lib: Callable[[Path, Any], dict]) -> int:
    """The command line of a ceiling tool: compile ``source`` for the local GPU (or ``--arch``),
    measure with ``measure_lib(library, device properties)``, print and optionally save the JSON."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--arch", help="SM version to compile for (default: the local GPU's)")
    parser.add_argument("--out", help="write the result JSON here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"{tool}: needs a CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    arch = args.arch or f"{props.major}{props.minor}"
    result = {"device": props.name, "sms": props.multi_processor_count, "arch": f"sm_{arch}"}
    with tempfile.TemporaryDirectory() as tmp:
        result.update(measure_lib(build(arch, Path(tmp), source=source), props))
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main() -> int:
    return ceiling_cli("mma_ceiling", __doc__, SOURCE, measure_all)


if __name__ == "__main__":
    sys.exit(main())
