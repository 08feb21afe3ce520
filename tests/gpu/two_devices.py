"""The op on two GPUs in one process (not a pytest module; needs two CUDA devices).

SGLang runs one process per GPU, but a process may drive several (tests, tools, other servers),
and a kernel's per-device state (its opt-in to more than 48 KB of dynamic shared memory, the
occupancy queries) must then be set up on each device, not once per process. In a fresh process
this makes a plan and runs a call on cuda:0, then on cuda:1 while cuda:0 stays the current
device, and holds both to the float32 reference's bounds (``kdtree_verify.testing``'s
``assert_matches_reference``, as tests/gpu/test_kernel.py does). Prints ``ok`` on success and
exits non-zero on a mismatch. Run by ``tests/gpu/test_kernel.py`` in a subprocess.

    python tests/gpu/two_devices.py
"""

from __future__ import annotations

import sys

import torch

from kdtree_verify.cuda import verify_attention_cuda
from kdtree_verify.plan import make_plan
from kdtree_verify.testing import assert_matches_reference, make_case


def run_on(device: torch.device) -> None:
    """One call on ``device``, held to the float32 reference's bounds (AssertionError if not)."""
    case = make_case((5000, 70), 8, 16, dtype=torch.bfloat16, device=device, seed=device.index)
    total, heads = case.q.shape[:2]
    plan = make_plan(2, heads, total, device)
    plan.update(case.qo_indptr, case.kv_indptr, case.mask_indptr)
    out = torch.empty(total, heads, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(total, heads, dtype=torch.float32, device=device)
    verify_attention_cuda(*case.args(plan=plan), out, lse)
    torch.cuda.synchronize(device)
    assert_matches_reference(out, lse, case.args(), str(device))
    print(f"{device}: matches the reference")


def main() -> int:
    if torch.cuda.device_count() < 2:
        print("needs two CUDA devices")
        return 2
    torch.cuda.set_device(0)
    run_on(torch.device("cuda", 0))
    run_on(torch.device("cuda", 1))
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
