"""DDTree's tree search as one Triton kernel (``ddtree.heap_search``), run by Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1): ``build_tree``'s trees bit for bit, ties included,
and the switch that picks it."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kdtree_inference.ddtree.heap_search import best_first_heap, heap_search_nodes
from kdtree_inference.ddtree.options import ddtree_search
from kdtree_inference.ddtree.step_graphs import tree_search
from kdtree_inference.ddtree.tree import build_trees, max_tree_nodes, search_nodes
from kdtree_inference.settings import SettingsError

FIELDS = ("tokens", "parents", "depths", "scores")
"""What ``best_first_heap`` returns, in order."""


def batch_of_drafts(seed: int, batch: int, depth: int, top_k: int, ties: bool):
    """Each request's top-k per depth, most likely first, as the draft's head gives them
    (float32 log-probs; with ``ties`` a few distinct values, so equal path scores are common;
    one request rules out tokens, -inf)."""
    rng = np.random.default_rng(seed)
    if ties:
        logprobs = -rng.integers(0, 3, size=(batch, depth, top_k)).astype(np.float32)
    else:
        logprobs = np.log(rng.dirichlet(np.ones(64), size=(batch, depth))[..., :top_k])
    logprobs = -np.sort(-logprobs, axis=-1).astype(np.float32)
    if top_k > 2:
        logprobs[0, depth // 2, top_k - 2 :] = -np.inf
    tokens = np.stack(
        [
            np.stack([rng.choice(4096, size=top_k, replace=False) for _ in range(depth)])
            for _ in range(batch)
        ]
    )
    roots = rng.integers(0, 4096, size=batch)
    return torch.from_numpy(roots), torch.from_numpy(tokens), torch.from_numpy(logprobs)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(("depth", "top_k"), [(1, 4), (3, 3), (6, 2), (15, 1), (15, 8)])
def test_the_kernel_makes_build_trees_trees(depth, top_k, ties):
    """Every node, in order, with its parent, depth and float64 score: build_tree's own."""
    roots, tokens, logprobs = batch_of_drafts(depth * 10 + top_k, 3, depth, top_k, ties)
    budgets = [b for b in (1, 2, 5, 16, 33, 64) if b <= max_tree_nodes(depth, top_k)]
    for budget in budgets:
        got = best_first_heap(roots, tokens, logprobs, budget)
        expected = build_trees(roots, tokens, logprobs, budget)
        for field, mine, reference in zip(FIELDS, got, expected, strict=True):
            assert mine.tolist() == reference.tolist(), (budget, field)


def test_the_kernels_trees_are_search_nodes_trees_where_no_scores_tie():
    roots, tokens, logprobs = batch_of_drafts(5, 4, 15, 8, ties=False)
    heap = heap_search_nodes(roots, tokens, logprobs, 32)
    torch_nodes = search_nodes(roots, tokens, logprobs, 32)
    for field in ("tokens", "parents", "depths", "ancestors"):
        assert torch.equal(getattr(heap, field), getattr(torch_nodes, field)), field


def test_the_kernel_refuses_what_it_cannot_search():
    roots, tokens, logprobs = batch_of_drafts(0, 2, 2, 2, ties=False)
    with pytest.raises(ValueError, match="budget 7 must be 1 to the 6 paths"):
        best_first_heap(roots, tokens, logprobs, 7)
    with pytest.raises(ValueError, match="budget 0 must be 1"):
        best_first_heap(roots, tokens, logprobs, 0)
    with pytest.raises(ValueError, match=r"must be \[bs\], \[bs, depth, k\]"):
        best_first_heap(roots, tokens[:, :1], logprobs, 2)


def test_the_search_is_picked_by_its_setting():
    assert ddtree_search({}) == "triton"
    assert tree_search(ddtree_search({})) is heap_search_nodes
    assert tree_search(ddtree_search({"KDTREE_DDTREE_SEARCH": "Torch"})) is search_nodes
    with pytest.raises(SettingsError, match="KDTREE_DDTREE_SEARCH"):
        ddtree_search({"KDTREE_DDTREE_SEARCH": "cuda"})
    with pytest.raises(ValueError, match="tree search 'cuda': choose torch or triton"):
        tree_search("cuda")


COMPILE = """
import json, pathlib, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kdtree_inference.ddtree.heap_search import _best_first_kernel

arch = int(sys.argv[1])
pointers = {"roots_ptr": "*i64", "top_tokens_ptr": "*i64", "top_logprobs_ptr": "*fp32"}
pointers |= {"tokens_ptr": "*i64", "parents_ptr": "*i64", "depths_ptr": "*i64"}
pointers |= {"scores_ptr": "*fp64"}
scalars = ("depth", "top_k", "budget", "tok_stride_b", "tok_stride_d", "lp_stride_b", "lp_stride_d")
sizes = {"FRONTIER": 128, "NODES": 128, "CANDIDATES": 128}
signature = pointers | dict.fromkeys(scalars, "i32") | dict.fromkeys(sizes, "constexpr")
source = ASTSource(fn=_best_first_kernel, signature=signature, constexprs=sizes)
compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": 1})
ptx = pathlib.Path(tempfile.mkdtemp()) / "heap.ptx"
ptx.write_text(compiled.asm["ptx"])
tools = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
ptxas = tools / ("ptxas-blackwell" if arch >= 100 else "ptxas")
gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
done = subprocess.run(
    [str(ptxas), "-v", f"--gpu-name={gpu}", str(ptx), "-o", str(ptx.with_suffix(".cubin"))],
    capture_output=True, text=True, check=True,
)
print(done.stdout + done.stderr)
"""


@pytest.mark.parametrize("arch", [80, 90, 120])
def test_the_kernel_compiles_for_each_architecture_without_spills(arch):
    """Triton's compiler and its bundled ptxas, no GPU needed: the kernel builds for sm_80,
    sm_90 and sm_120 at the largest budget (64), in registers (no local-memory spills). In a
    process of its own: the interpreter the other tests run leaves Triton's language patched."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, str(arch)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in done.stdout, done.stdout
