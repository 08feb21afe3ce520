"""DDTree's tree work of a decode step as CUDA graphs: the search before the verify, the
acceptance walk after it.

Run eagerly, the best-first search, the ancestor closure, the greedy walk and the KV moves are
about two hundred small kernels a step, and the host enqueues them slower than the GPU runs them:
3.4 ms a step at budget 16 and 5.2 ms at 64 on an H100's host, replayed 0.30 and 0.57 ms
(``kdtree_bench.profiling.ddtree_tree_bench``); eagerly, about what the draft and the verify cost
together at short contexts. Their shapes depend only on the batch size, so each batch size captures them
once, on first use (one device synchronize then), and every later step replays them: two graph
launches and a few copies. The verify mask, whose size follows the prefix lengths, stays eager
(``tree.layout_from_nodes``).

What a step hands on to SGLang is copied out of the graphs' static buffers, which the next step's
replay overwrites.

Every graph captures into one memory pool, so a server that sees many batch sizes holds their
outputs and one set of scratch (the sorts' workspaces, the walk's temporaries), not scratch per
graph beyond SGLang's KV sizing. A captured graph's outputs stay allocated (its ``_Captured``
holds them), so no later capture takes the memory of the outputs a graph reads; a later capture
may place its outputs in an earlier graph's scratch, so any replay may overwrite the outputs of
another batch size's graphs. A step replays its batch size's search and walk with nothing between
them, and what it hands on is copied out, so the next step, of any batch size, is free to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .tree import Acceptance, AcceptedStep, TreeNodes, accept_step, search_nodes

logger = logging.getLogger("kdtree.ddtree")


@dataclass
class _Captured:
    """One graph with the static inputs it reads and the outputs it writes."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: object

    def run(self, *args: torch.Tensor) -> object:
        for static, arg in zip(self.inputs, args, strict=True):
            if static.shape != arg.shape:
                raise ValueError(
                    f"graph input of shape {tuple(static.shape)} got {tuple(arg.shape)}"
                )
            static.copy_(arg)
        self.graph.replay()
        return self.outputs


def _capture(fn: Callable[..., object], args: tuple[torch.Tensor, ...], pool: tuple) -> _Captured:
    """Capture ``fn`` over static copies of ``args`` into ``pool``, after one warm-up run off the
    graph (lazy initialisations such as cuBLAS's handle must not happen inside a capture)."""
    inputs = tuple(arg.clone() for arg in args)
    side = torch.cuda.Stream(device=inputs[0].device)
    side.wait_stream(torch.cuda.current_stream(inputs[0].device))
    with torch.cuda.stream(side):
        fn(*inputs)
    torch.cuda.current_stream(inputs[0].device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: a capture in the scheduler's thread tolerates CUDA calls of other threads.
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = fn(*inputs)
    return _Captured(graph, inputs, outputs)


def tree_search(name: str) -> Callable[..., TreeNodes]:
    """The search called ``name`` (``KDTREE_DDTREE_SEARCH``): ``torch`` (``tree.search_nodes``)
    or ``triton`` (``heap_search.heap_search_nodes``, whose module imports Triton)."""
    if name == "torch":
        return search_nodes
    if name == "triton":
        from .heap_search import heap_search_nodes

        return heap_search_nodes
    raise ValueError(f"tree search {name!r}: choose torch or triton")


class TreeStepGraphs:
    """The search and the acceptance walk of every batch size seen, as CUDA graphs. ``search``
    is ``tree.search_nodes`` or another function of its contract (``tree_search``)."""

    def __init__(self, budget: int, search: Callable[..., TreeNodes] = search_nodes) -> None:
        self.budget = int(budget)
        self._search_nodes = search
        self._search: dict[int, _Captured] = {}
        self._accept: dict[int, _Captured] = {}
        self._pool: tuple | None = None  # the captures' shared pool, made by the first one

    def _capture(self, fn: Callable[..., object], args: tuple[torch.Tensor, ...]) -> _Captured:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return _capture(fn, args, self._pool)

    def search(
        self, roots: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor
    ) -> TreeNodes:
        """The search for ``[bs]`` roots and ``[bs, depth, k]`` top-k; the result lives in
        the graph's buffers until the next search, of any batch size."""
        bs = int(roots.shape[0])
        args = (roots.reshape(bs), top_tokens, top_logprobs)
        if bs not in self._search:
            logger.info("DDTREE: capturing the tree search for batch size %d", bs)
            self._search[bs] = self._capture(
                lambda r, t, lp: self._search_nodes(r, t, lp, self.budget), args
            )
        return self._search[bs].run(*args)

    def accept(self, predict: torch.Tensor, window: torch.Tensor) -> AcceptedStep:
        """``accept_step`` on the trees of this batch size's last ``search``: ``[bs, W]`` target
        predictions and verify-window slots. The acceptance is copied out of the graph (it
        leaves the step); rows and moves are for this step only."""
        bs = int(window.shape[0])
        if bs not in self._search:
            raise RuntimeError(f"DDTREE: accept for batch size {bs} before its tree search")
        args = (predict.reshape(window.shape), window)
        if bs not in self._accept:
            nodes = self._search[bs].outputs
            logger.info("DDTREE: capturing the acceptance walk for batch size %d", bs)
            self._accept[bs] = self._capture(lambda p, w: accept_step(nodes, p, w), args)
        step = self._accept[bs].run(*args)
        acceptance = step.acceptance
        return replace(
            step,
            acceptance=Acceptance(
                accept_lens=acceptance.accept_lens.clone(),
                chain_index=acceptance.chain_index,
                bonus=acceptance.bonus.clone(),
                out_tokens=acceptance.out_tokens.clone(),
                commit_lens=acceptance.commit_lens.clone(),
            ),
        )
