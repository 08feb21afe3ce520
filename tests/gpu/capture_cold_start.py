"""Every kernel of the op first launched inside a CUDA-graph capture (not a pytest module).

SGLang's graph runner calls each batch size eagerly before capturing it, and so do our other
graph tests, so the kernels are normally loaded (CUDA loads them lazily, at their first launch)
and the per-device queries made before any capture. This script does nothing of the kind: in a
fresh process the plan kernel, the attention kernel, and both combine kernels (the wide batch for
a call of 64 rows, the narrow one for 384 rows, more than one wave of the wide batch on any
device) are first launched, and the combine's occupancy query first made, inside
``torch.cuda.graph`` (its default, global capture mode). The graph must replay to the eager
result bit for bit. Run by ``tests/gpu/test_kernel.py`` in a subprocess; prints ``ok`` on success.

    python tests/gpu/capture_cold_start.py
"""

from __future__ import annotations

import sys

import torch

from kdtree_verify.cuda import verify_attention_cuda
from kdtree_verify.plan import VerifyPlan, make_plan
from kdtree_verify.testing import VerifyCase, make_case

# (prefix_lens, draft tokens, heads): 1 x 8 x 8 = 64 rows, 3 x 8 x 16 = 384 rows.
CASES = [((5000,), 8, 8), ((3000, 70, 4097), 8, 16)]


def launch(case: VerifyCase, plan: VerifyPlan, out: torch.Tensor, lse: torch.Tensor) -> None:
    plan.update(case.qo_indptr, case.kv_indptr, case.mask_indptr)
    verify_attention_cuda(*case.args(plan=plan), out, lse)


def main() -> int:
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    calls = []
    for prefix_lens, num_draft, num_heads in CASES:
        case = make_case(prefix_lens, num_draft, num_heads, dtype=torch.bfloat16, device=device)
        total = len(prefix_lens) * num_draft
        # An explicit CTA target: the default one would query (and so load) the attention kernel.
        plan = make_plan(len(prefix_lens), num_heads, total, device, target_ctas=sms)
        if plan.max_splits <= 1:
            print(f"{prefix_lens}: the plan has no splits, so no combine to test", flush=True)
            return 1
        out = torch.zeros(total, num_heads, 512, dtype=torch.bfloat16, device=device)
        lse = torch.zeros(total, num_heads, dtype=torch.float32, device=device)
        calls.append((case, plan, out, lse))
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            launch(*call)
    graph.replay()
    torch.cuda.synchronize()

    bad = 0
    for case, plan, out, lse in calls:
        eager_out, eager_lse = torch.empty_like(out), torch.empty_like(lse)
        launch(case, plan, eager_out, eager_lse)
        torch.cuda.synchronize()
        same = torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
        finite = bool(torch.isfinite(out).all())
        rows = out.shape[0] * out.shape[1]
        print(f"{case.prefix_lens} rows={rows}: replay equals eager={same}, finite={finite}")
        bad += not (same and finite)
    if bad:
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
