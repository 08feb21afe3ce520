"""The attention kernel's main loop in SASS: how many instructions it issues per KV tile, and which.

Device time is scarce; the instruction mix of the main loop is not. This compiles the kernel to a
cubin per architecture (``_ptxas.compile_arch``), disassembles it with ``cuobjdump -sass`` and
finds the main loop (the backward branch whose body holds the most tensor-core MMAs), then counts
its opcodes. The loop body is static code: it also holds the rarely taken paths (the softmax
rescale, masking, a separate V buffer), so the count is an upper bound on what one tile issues.

    python -m kdtree_verify._sass [--archs 90;120] [--kernel attention_kernel<bf16>]

Without ``--archs`` it reads the archs the extension is built for (``KDTREE_CUDA_ARCHS`` or
``cuda_archs.txt``).

``cuobjdump`` comes from the CUDA toolkit (PATH, $CUDA_HOME/bin) or, failing that, from the copy
that Triton's wheel carries.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import _ptxas
from ._build import cuda_archs, parse_archs
from ._settings import build_settings

_FUNCTION = re.compile(r"^\s*Function : (?P<name>\S+)", re.M)
_INSTRUCTION = re.compile(r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<text>[^;]*);", re.M)
_BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x(?P<target>[0-9a-f]+)")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")


@dataclass(frozen=True)
class LoopStats:
    """Opcode counts of one loop body (static instructions between target and back-edge)."""

    kernel: str
    arch: str
    instructions: int
    opcodes: Counter

    @property
    def mma(self) -> int:
        return self.opcodes["HMMA"]

    def summary(self) -> str:
        top = ", ".join(f"{op} {n}" for op, n in self.opcodes.most_common(12))
        return (
            f"{self.arch} {self.kernel}: main loop {self.instructions} instructions, "
            f"{self.mma} HMMA ({self.instructions / max(self.mma, 1):.1f} per MMA); {top}"
        )


def find_cuobjdump() -> str:
    """cuobjdump from PATH, $CUDA_HOME/bin or Triton's wheel; a clear error otherwise."""
    cuda_home = build_settings().cuda_home
    folders = [cuda_home / "bin"] if cuda_home is not None else []
    with contextlib.suppress(ImportError):
        import triton

        folders.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin")
    found = shutil.which("cuobjdump") or next(
        (str(f / "cuobjdump") for f in folders if (f / "cuobjdump").exists()), None
    )
    if found is None:
        raise RuntimeError("cuobjdump not found (PATH, $CUDA_HOME/bin, or triton's nvidia backend)")
    return found


def opcode(text: str) -> str:
    """'@!P0 HMMA.16816.F32.BF16 R1, ...' -> 'HMMA'."""
    return _PREDICATE.sub("", text).split(None, 1)[0].split(".")[0]


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Mangled function name -> [(address, instruction text)] of a ``cuobjdump -sass`` listing."""
    starts = list(_FUNCTION.finditer(sass))
    out: dict[str, list[tuple[int, str]]] = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(sass)
        body = sass[match.end() : end]
        out[match["name"]] = [
            (int(m["addr"], 16), m["text"].strip()) for m in _INSTRUCTION.finditer(body)
        ]
    return out


def main_loop(instructions: list[tuple[int, str]]) -> list[str]:
    """The body of the backward branch whose body holds the most HMMA (empty if none)."""
    index = {addr: i for i, (addr, _) in enumerate(instructions)}
    best: list[str] = []
    for i, (addr, text) in enumerate(instructions):
        target = _BRANCH_TARGET.search(text) if opcode(text) == "BRA" else None
        if target is None:
            continue
        start = int(target["target"], 16)
        if start < addr and start in index:
            body = [t for _, t in instructions[index[start] : i + 1]]
            if sum(opcode(t) == "HMMA" for t in body) > sum(opcode(t) == "HMMA" for t in best):
                best = body
    return best


def loop_stats(archs: list[str], kernel: str = "attention_kernel<bf16>") -> list[LoopStats]:
    """Compile for each arch and return the main-loop statistics of ``kernel``."""
    nvcc, cuobjdump = _ptxas.find_nvcc(), find_cuobjdump()
    stats = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            cubin = Path(tmp) / f"verify_sm{arch}.cubin"
            _ptxas.compile_arch(nvcc, arch, cubin)
            sass = subprocess.run(
                [cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True
            ).stdout
            matches = {
                n: body for n, body in functions(sass).items() if _ptxas.short_name(n) == kernel
            }
            if not matches:
                raise RuntimeError(f"sm_{arch}: no function {kernel!r} in the cubin")
            body = main_loop(next(iter(matches.values())))
            stats.append(LoopStats(kernel, f"sm_{arch}", len(body), Counter(map(opcode, body))))
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", help="SM versions, e.g. '90;120' (default: the kernel's list)")
    parser.add_argument("--kernel", default="attention_kernel<bf16>")
    args = parser.parse_args()
    archs = parse_archs(args.archs, "--archs") if args.archs else cuda_archs()
    try:
        for stats in loop_stats(archs, args.kernel):
            print(stats.summary())
    except RuntimeError as exc:
        print(f"sass: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
