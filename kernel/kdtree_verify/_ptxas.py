"""Compile the kernel's device code per architecture with ``ptxas -v`` and check the report.

This is the CI check that runs without a GPU (nvcc only): every kernel of ``csrc/verify_kernel.cu``
is compiled to a cubin for each SM version (default: ``cuda_archs.txt``), and the ptxas report
must show no spill stores/loads, no stack frame in the attention kernel, registers that fit the
launch (threads x registers <= 64K), and for sm_120 at most 101,376 bytes of shared memory per
block (static from ptxas + the dynamic size from ``csrc/verify_config.h``).

    python -m kdtree_verify._ptxas [--archs 'SM;SM'] [--out bench/results/ptxas_summary.json]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ._build import CSRC_DIR, cuda_archs, nvcc_flags, parse_archs
from ._settings import build_settings

SM120_SMEM_LIMIT = 101_376
REGISTER_FILE = 65_536
KERNEL_SOURCE = CSRC_DIR / "verify_kernel.cu"

_FUNC = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\d+)'")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"Used (?P<regs>\d+) registers(?P<rest>.*)")
_SMEM = re.compile(r"(?P<smem>\d+) bytes smem")
_INT_ARG = re.compile(r"L[ij](\d+)E")  # an int template argument, e.g. Li9E
_FP8_NUMERICS = re.compile(r"Fp8NumericsE(\d+)E")  # an Fp8Numerics template argument
FP8_NUMERICS_SUFFIX = {"1": "triton", "2": "triton_rowmax"}
"""Fp8Numerics values (csrc/verify_kernel.cu) -> name suffix; kFp16Operands (0) adds none."""


@dataclass
class KernelReport:
    arch: str
    kernel: str  # short name: plan_kernel, attention_kernel<bf16>, ...
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    static_smem: int
    dynamic_smem: int
    threads: int

    @property
    def smem_per_block(self) -> int:
        return self.static_smem + self.dynamic_smem


def find_nvcc() -> str:
    """nvcc from PATH or CUDA_HOME; a clear error if neither has one."""
    nvcc = shutil.which("nvcc")
    cuda_home = build_settings().cuda_home
    if nvcc is None and cuda_home is not None:
        candidate = cuda_home / "bin" / "nvcc"
        nvcc = str(candidate) if candidate.exists() else None
    if nvcc is None:
        raise RuntimeError("nvcc not found on PATH or in $CUDA_HOME/bin: the ptxas check needs it")
    return nvcc


CONFIG_EXPRESSIONS = {
    "smem": "kSmemBytes",
    "threads": "kThreads",
    "combine_threads": "kCombineWarps * 32",
    "plan_threads": "kPlanThreads",
    "m_tiles": "kMTiles",
    "qk_slice": "kQkSlice",
    "v_slice": "kVSlice",
    "block_n": "kBlockN",
}
"""Name -> C++ expression over verify_config.h, evaluated by ``config_constants``."""


def config_constants() -> dict[str, int]:
    """``CONFIG_EXPRESSIONS`` as the compiler sees them (a host-compiled probe)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("a host C++ compiler (g++) is needed to read verify_config.h")
    prints = "".join(
        f'  std::printf("%d\\n", static_cast<int>({expr}));\n'
        for expr in CONFIG_EXPRESSIONS.values()
    )
    probe = (
        '#include <cstdio>\n#include "verify_config.h"\n'
        f"int main() {{\n  using namespace kdtree;\n{prints}}}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.cpp", Path(tmp) / "probe"
        src.write_text(probe)
        subprocess.run(
            [cxx, "-std=c++17", f"-I{CSRC_DIR}", str(src), "-o", str(exe)],
            check=True,
            capture_output=True,
        )
        values = map(int, subprocess.check_output([str(exe)]).split())
    return dict(zip(CONFIG_EXPRESSIONS, values, strict=True))


def short_name(mangled: str) -> str:
    """'..attention_kernelI13__nv_bfloat16..' -> 'attention_kernel<bf16>'; integer template
    arguments follow the type, so the combine's two batch sizes stay apart:
    '..combine_kernelI6__halfLi9EE..' -> 'combine_kernel<fp16,9>'; the fp8-pool attention kernel
    is 'attention_kernel<bf16,fp8kv>', and with SGLang's Triton numerics
    'attention_kernel<bf16,fp8kv,triton>' (its row-max pass '...,triton_rowmax>')."""
    for name in ("plan_kernel", "attention_kernel", "combine_kernel"):
        if name in mangled:
            args = mangled[mangled.index(name) + len(name) :]
            params = ["bf16"] if "bfloat16" in args else ["fp16"] if "half" in args else []
            params += _INT_ARG.findall(args)
            if "Lb1E" in args:  # attention_kernel<Elem, true>: the fp8-pool instantiation
                params.append("fp8kv")
            params += [FP8_NUMERICS_SUFFIX[v] for v in _FP8_NUMERICS.findall(args) if v != "0"]
            return f"{name}<{','.join(params)}>" if params else name
    return mangled


def compile_arch(nvcc: str, arch: str, cubin: Path | None = None) -> str:
    """The ptxas -v report of one cubin compile (device code only, no host link); the cubin is
    kept at ``cubin`` when given."""
    flags = [f for f in nvcc_flags([arch]) if not f.startswith("-gencode")]
    with tempfile.TemporaryDirectory() as tmp:
        target = cubin if cubin is not None else Path(tmp) / f"verify_sm{arch}.cubin"
        cmd = [
            nvcc,
            "-cubin",
            f"-arch=sm_{arch}",
            "-std=c++17",
            *flags,
            "-Xptxas",
            "-v",
            f"-I{CSRC_DIR}",
            str(KERNEL_SOURCE),
            "-o",
            str(target),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed for sm_{arch}:\n{done.stderr}")
    return done.stderr + done.stdout


def parse_report(text: str, consts: dict[str, int]) -> list[KernelReport]:
    reports: list[KernelReport] = []
    current: dict | None = None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            current = {"arch": m["arch"], "kernel": short_name(m["name"])}
        elif current is not None and (m := _FRAME.search(line)):
            current.update(
                stack_frame=int(m["stack"]),
                spill_stores=int(m["stores"]),
                spill_loads=int(m["loads"]),
            )
        elif current is not None and (m := _USED.search(line)):
            smem = _SMEM.search(m["rest"])
            kernel = current["kernel"]
            is_attention = kernel.startswith("attention_kernel")
            threads = (
                consts["threads"]
                if is_attention
                else consts["combine_threads"]
                if kernel.startswith("combine_kernel")
                else consts["plan_threads"]
            )
            reports.append(
                KernelReport(
                    arch=current["arch"],
                    kernel=kernel,
                    registers=int(m["regs"]),
                    spill_stores=current.get("spill_stores", 0),
                    spill_loads=current.get("spill_loads", 0),
                    stack_frame=current.get("stack_frame", 0),
                    static_smem=int(smem["smem"]) if smem else 0,
                    dynamic_smem=consts["smem"] if is_attention else 0,
                    threads=threads,
                )
            )
            current = None
    return reports


def problems(reports: list[KernelReport]) -> list[str]:
    """Everything that violates the CI rules (empty list = clean)."""
    found = []
    for r in reports:
        where = f"{r.kernel} on {r.arch}"
        if r.spill_stores or r.spill_loads:
            found.append(f"{where}: spills ({r.spill_stores} B stores, {r.spill_loads} B loads)")
        if r.kernel.startswith("attention_kernel") and r.stack_frame:
            found.append(f"{where}: {r.stack_frame} B stack frame (local memory in the hot loop)")
        if r.registers * r.threads > REGISTER_FILE:
            found.append(f"{where}: {r.registers} registers x {r.threads} threads > 64K")
        if r.arch == "sm_120" and r.smem_per_block > SM120_SMEM_LIMIT:
            found.append(f"{where}: {r.smem_per_block} B shared memory > {SM120_SMEM_LIMIT}")
    return found


def check(archs: list[str]) -> tuple[list[KernelReport], list[str]]:
    nvcc = find_nvcc()
    consts = config_constants()
    reports = []
    for arch in archs:
        reports.extend(parse_report(compile_arch(nvcc, arch), consts))
    return reports, problems(reports)


def main() -> int:
    parser = argparse.ArgumentParser(description="ptxas -v check of the verify kernel")
    parser.add_argument(
        "--archs", help="SM versions (default: KDTREE_CUDA_ARCHS or the kernel's list)"
    )
    parser.add_argument("--out", help="write the summary JSON here")
    args = parser.parse_args()
    archs = parse_archs(args.archs, "--archs") if args.archs else cuda_archs()
    reports, found = check(archs)
    for r in reports:
        print(
            f"{r.arch:7s} {r.kernel:24s} regs {r.registers:3d}  spills {r.spill_stores}/"
            f"{r.spill_loads}  stack {r.stack_frame}  smem/block {r.smem_per_block}"
        )
    if args.out:
        summary = {
            "source": str(KERNEL_SOURCE.relative_to(CSRC_DIR.parent.parent)),
            "nvcc": subprocess.check_output([find_nvcc(), "--version"], text=True).splitlines()[-1],
            "sm120_smem_limit": SM120_SMEM_LIMIT,
            "kernels": [asdict(r) | {"smem_per_block": r.smem_per_block} for r in reports],
            "problems": found,
        }
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {args.out}")
    for p in found:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
