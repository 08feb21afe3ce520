"""bench/without_flashinfer: DFlash's sampling verify is marked unavailable, nothing else changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK_DIR = ROOT / "bench" / "without_flashinfer"

# On a CPU machine SGLang has no sampling-verify kernel, so its flag is already False: the probe
# stands a kernel in first, as a CUDA build has, and reports the flag dflash_utils ends up with.
PROBE = """
import importlib.util, sys
from sglang.kernels.ops.speculative import verify_sampling
verify_sampling.tree_speculative_sampling_target_only = object()
spec = importlib.util.spec_from_file_location("hook", {hook_dir!r} + "/sitecustomize.py")
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)
if {install}:
    hook.install()
from sglang.srt.speculative import dflash_utils
print(dflash_utils.is_dflash_sampling_verify_available(), dflash_utils.DEFAULT_DFLASH_MASK_TOKEN)
"""


def _probe(install: bool) -> list[str]:
    code = PROBE.format(hook_dir=str(HOOK_DIR), install=install)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return done.stdout.split()


def test_the_hook_marks_dflash_sampling_verify_unavailable() -> None:
    assert _probe(install=True) == ["False", "<|MASK|>"]


def test_without_the_hook_the_stood_in_kernel_makes_it_available() -> None:
    assert _probe(install=False) == ["True", "<|MASK|>"]
