"""DDTree's best-first tree search as one Triton kernel: ``tree.build_tree``'s heap, per request.

``tree.best_first_nodes`` finds the same trees with batched torch ops: a stable sort of every
depth's candidates, fifteen or so sorts a step, each several kernels. Replayed as CUDA graphs,
the whole tree stretch (search, layout, walk) took 0.57 ms of GPU time at budget 16 and 0.88 ms
at 64 on an H100 (e2e 46). PyTorch's profile of the eager stretch at budget 16 (e2e 45) puts
the sorts at 31% of its GPU time (153 of 490 µs a step) and the search's index arithmetic
(floor_divide, remainder) at 9% more. Here one program
per request runs the search of ``build_tree`` itself: ``budget`` pops of a frontier of at most
``budget + 1`` candidates held in registers, each a max and a min over it, each pop pushing the
node's first child and its next sibling. Scores are float64 sums of the float32
log-probabilities, and ties go to the candidate found first, as in ``build_tree``, so the trees
are ``build_tree``'s bit for bit, ties included (``best_first_nodes`` orders tied paths
differently: the trees hold the same paths wherever no two scores tie).

The kernel is plain Triton (no architecture-specific instruction), captured in CUDA graphs like
any kernel. Its CPU check runs under Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tree import TreeNodes, max_tree_nodes, tree_nodes

_EMPTY = tl.constexpr(1 << 30)  # a free frontier slot's discovery order: after every real one


@triton.jit
def _pick(values, at):
    """The element of ``values`` where ``at`` holds (one lane): a select among registers."""
    return tl.sum(tl.where(at, values, 0), axis=0)


@triton.jit
def _push(
    f_score,
    f_order,
    f_parent,
    f_level,
    f_rank,
    order,
    FRONTIER: tl.constexpr,
    wanted,
    score,
    parent,
    level,
    rank,
):
    """The frontier with a candidate in its first free slot where ``wanted``, found after every
    candidate before it (``order`` + 1); and the discovery order so far."""
    slots = tl.arange(0, FRONTIER)
    free = tl.min(tl.where(f_order < _EMPTY, FRONTIER, slots), axis=0)
    into = (slots == free) & wanted
    order += wanted.to(tl.int32)
    return (
        tl.where(into, score, f_score),
        tl.where(into, order, f_order),
        tl.where(into, parent, f_parent),
        tl.where(into, level, f_level),
        tl.where(into, rank, f_rank),
        order,
    )


@triton.jit
def _best_first_kernel(
    roots_ptr,
    top_tokens_ptr,
    top_logprobs_ptr,
    tokens_ptr,
    parents_ptr,
    depths_ptr,
    scores_ptr,
    depth,
    top_k,
    budget,
    tok_stride_b,
    tok_stride_d,
    lp_stride_b,
    lp_stride_d,
    FRONTIER: tl.constexpr,
    NODES: tl.constexpr,
    CANDIDATES: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    width = budget + 1
    slots = tl.arange(0, FRONTIER)
    node_ids = tl.arange(0, NODES)
    neg_inf = float("-inf")
    # The request's depth x k candidates, in registers: a pop reads them by index, and a
    # select-and-sum over registers costs less than a global load's latency in the loop.
    cells = tl.arange(0, CANDIDATES)
    in_block = cells < depth * top_k
    cell_depth, cell_rank = cells // top_k, cells % top_k
    all_tokens = tl.load(
        top_tokens_ptr + b * tok_stride_b + cell_depth * tok_stride_d + cell_rank,
        mask=in_block,
        other=0,
    )
    all_logprobs = tl.load(
        top_logprobs_ptr + b * lp_stride_b + cell_depth * lp_stride_d + cell_rank,
        mask=in_block,
        other=0.0,
    ).to(tl.float64)

    # The root, node 0: the bonus token, its own parent, depth 0, score 0.
    tl.store(tokens_ptr + b * width, tl.load(roots_ptr + b))
    tl.store(parents_ptr + b * width, 0)
    tl.store(depths_ptr + b * width, 0)
    tl.store(scores_ptr + b * width, 0.0)
    node_scores = tl.zeros([NODES], dtype=tl.float64)

    # The frontier: a candidate's score, discovery order, parent node, depth and rank. Its
    # first candidate is the root's first child, at order 0.
    first = slots == 0
    f_score = tl.where(first, _pick(all_logprobs, cells == 0), neg_inf)
    f_order = tl.where(first, 0, _EMPTY)
    f_parent = tl.zeros([FRONTIER], dtype=tl.int32)
    f_level = tl.where(first, 1, 0)
    f_rank = tl.zeros([FRONTIER], dtype=tl.int32)
    order = tl.zeros([], dtype=tl.int32)

    for node in range(1, width):
        # Pop the best candidate; of equal scores, the one found first.
        used = f_order < _EMPTY
        best = tl.max(tl.where(used, f_score, neg_inf), axis=0)
        pick = tl.min(tl.where(used & (f_score == best), f_order, _EMPTY), axis=0)
        popped = f_order == pick
        parent = _pick(f_parent, popped)
        level = _pick(f_level, popped)
        rank = _pick(f_rank, popped)
        token = _pick(all_tokens, cells == (level - 1) * top_k + rank)
        tl.store(tokens_ptr + b * width + node, token)
        tl.store(parents_ptr + b * width + node, parent.to(tl.int64))
        tl.store(depths_ptr + b * width + node, level.to(tl.int64))
        tl.store(scores_ptr + b * width + node, best)
        node_scores = tl.where(node_ids == node, best, node_scores)
        f_order = tl.where(popped, _EMPTY, f_order)

        # Its first child, one depth down; then its next sibling, the same parent's next rank.
        child_lp = _pick(all_logprobs, cells == level * top_k)
        f_score, f_order, f_parent, f_level, f_rank, order = _push(
            f_score,
            f_order,
            f_parent,
            f_level,
            f_rank,
            order,
            FRONTIER,
            level < depth,
            best + child_lp,
            node,
            level + 1,
            0,
        )
        sibling_lp = _pick(all_logprobs, cells == (level - 1) * top_k + rank + 1)
        parent_score = _pick(node_scores, node_ids == parent)
        f_score, f_order, f_parent, f_level, f_rank, order = _push(
            f_score,
            f_order,
            f_parent,
            f_level,
            f_rank,
            order,
            FRONTIER,
            rank + 1 < top_k,
            parent_score + sibling_lp,
            parent,
            level,
            rank + 1,
        )


def best_first_heap(
    roots: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor, budget: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``build_tree`` for a batch in one kernel launch, without a host sync: ``roots`` ``[bs]``,
    ``top_tokens``/``top_logprobs`` ``[bs, depth, k]`` (each depth's candidates, most likely
    first). Returns ``(tokens, parents, depths, scores)``, each ``[bs, budget + 1]``, nodes in
    the order ``build_tree`` chose them (the root first, its own parent)."""
    bs, depth, top_k = top_logprobs.shape
    if top_tokens.shape != top_logprobs.shape or roots.shape != (bs,):
        raise ValueError(
            f"roots {tuple(roots.shape)}, top_tokens {tuple(top_tokens.shape)} and top_logprobs "
            f"{tuple(top_logprobs.shape)} must be [bs], [bs, depth, k] and [bs, depth, k]"
        )
    if not 1 <= budget <= max_tree_nodes(depth, top_k):
        raise ValueError(
            f"budget {budget} must be 1 to the {max_tree_nodes(depth, top_k)} paths of depth "
            f"{depth} with {top_k} candidates each"
        )
    top_tokens, top_logprobs = top_tokens.contiguous(), top_logprobs.contiguous()
    device = top_logprobs.device
    tokens = torch.empty((bs, budget + 1), dtype=torch.int64, device=device)
    parents, depths = torch.empty_like(tokens), torch.empty_like(tokens)
    scores = torch.empty((bs, budget + 1), dtype=torch.float64, device=device)
    _best_first_kernel[(bs,)](
        roots.to(torch.int64),
        top_tokens,
        top_logprobs,
        tokens,
        parents,
        depths,
        scores,
        depth,
        top_k,
        budget,
        top_tokens.stride(0),
        top_tokens.stride(1),
        top_logprobs.stride(0),
        top_logprobs.stride(1),
        # Each pop frees a slot and fills at most two: at most budget + 1 candidates wait.
        FRONTIER=triton.next_power_of_2(budget + 2),
        NODES=triton.next_power_of_2(budget + 1),
        CANDIDATES=triton.next_power_of_2(depth * top_k),
        # One warp: every max, min and select of the loop stays within its shuffles.
        num_warps=1,
    )
    return tokens, parents, depths, scores


def heap_search_nodes(
    roots: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor, budget: int
) -> TreeNodes:
    """``best_first_heap``'s trees with their ancestor matrix (``tree.search_nodes``'s
    contract)."""
    tokens, parents, depths, _ = best_first_heap(roots, top_tokens, top_logprobs, budget)
    return tree_nodes(tokens, parents, depths)
