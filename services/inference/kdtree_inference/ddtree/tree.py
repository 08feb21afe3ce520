"""DDTree's draft tree: best-first construction, the verify layout, the greedy acceptance walk.

A DFlash draft predicts every position of its block in one pass, so position ``d`` has its own
distribution over the vocabulary, independent of which tokens were drafted before it. DDTree
(Ringel & Romano, "Accelerating Speculative Decoding with Block Diffusion Draft Trees") scores a
path ``(r_1, ..., r_d)`` -- the ``r_i``-th most likely token at depth ``i`` -- by the sum of its
log-probabilities and verifies the ``budget`` best paths as one tree. Since every log-probability
is at most 0 and each depth's candidates are sorted, a path never scores above its parent
(one token shorter) or its previous sibling (same parent, one rank better). So the ``budget``
best paths are prefix-closed, and a best-first search that expands a popped node into its first
child and its next sibling pops them in score order.

Node 0 is the root: the bonus token the last verify committed, at depth 0. Nodes are numbered
in the order they were chosen, so every parent precedes its children (the verify layout and the
acceptance walk rely on it).

The layout is what SGLang's tree verify takes (the EAGLE custom-mask format): per request
``W = budget + 1`` query rows, row-major ``W x (prefix_len + W)`` mask cells, prefix columns all
visible, draft columns holding the node itself and its ancestors.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DraftTree:
    """One request's tree: ``tokens[i]``, ``parents[i]`` (-1 for the root) and ``depths[i]``."""

    tokens: np.ndarray  # int64 [n]
    parents: np.ndarray  # int64 [n]
    depths: np.ndarray  # int64 [n]
    scores: np.ndarray  # float64 [n]: the path's summed draft log-probability (root: 0)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def ancestors(self) -> np.ndarray:
        """``[n, n]`` bool: row i marks node i and every ancestor of it."""
        n = self.size
        visible = np.zeros((n, n), dtype=bool)
        for node in range(n):
            parent = int(self.parents[node])
            if parent >= 0:
                visible[node] = visible[parent]
            visible[node, node] = True
        return visible


def max_tree_nodes(depth: int, top_k: int) -> int:
    """How many non-root nodes a tree of ``depth`` levels with ``top_k`` children per node holds."""
    return sum(top_k**level for level in range(1, depth + 1))


def build_tree(
    root_token: int,
    top_tokens: np.ndarray,
    top_logprobs: np.ndarray,
    budget: int,
) -> DraftTree:
    """The best-first tree of ``budget`` nodes below ``root_token``.

    ``top_tokens``/``top_logprobs`` are ``[depth, k]``: each depth's candidates, most likely
    first. Equal scores go to the path found first (the shallower one, then the better rank), so
    the tree is a deterministic function of its inputs.
    """
    top_tokens = np.asarray(top_tokens)
    top_logprobs = np.asarray(top_logprobs, dtype=np.float64)
    if top_tokens.ndim != 2 or top_tokens.shape != top_logprobs.shape:
        raise ValueError(
            f"top_tokens {top_tokens.shape} and top_logprobs {top_logprobs.shape} must both be "
            "[depth, k]"
        )
    if budget < 0:
        raise ValueError(f"budget must be non-negative, got {budget}")
    depth, top_k = top_tokens.shape
    tokens, parents, depths, scores = [int(root_token)], [-1], [0], [0.0]
    # (-score, order, parent node, depth of the candidate, rank of the candidate). Scores are
    # sums, never differences, so a -inf log-probability (a token the draft rules out) stays
    # -inf instead of turning into NaN.
    heap: list[tuple[float, int, int, int, int]] = []
    order = 0
    if depth > 0 and top_k > 0 and budget > 0:
        heap.append((-float(top_logprobs[0, 0]), order, 0, 1, 0))
    while heap and len(tokens) <= budget:
        neg_score, _, parent, level, rank = heapq.heappop(heap)
        node, score = len(tokens), -neg_score
        tokens.append(int(top_tokens[level - 1, rank]))
        parents.append(parent)
        depths.append(level)
        scores.append(score)
        if level < depth:  # first child
            order += 1
            child = score + float(top_logprobs[level, 0])
            heapq.heappush(heap, (-child, order, node, level + 1, 0))
        if rank + 1 < top_k:  # next sibling
            order += 1
            sibling = scores[parent] + float(top_logprobs[level - 1, rank + 1])
            heapq.heappush(heap, (-sibling, order, parent, level, rank + 1))
    return DraftTree(
        tokens=np.asarray(tokens, dtype=np.int64),
        parents=np.asarray(parents, dtype=np.int64),
        depths=np.asarray(depths, dtype=np.int64),
        scores=np.asarray(scores, dtype=np.float64),
    )


def build_trees(
    roots: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor, budget: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``build_tree`` for each request of a batch, stacked as the batched searches return their
    trees (``best_first_nodes``, ``heap_search.best_first_heap``): ``(tokens, parents, depths,
    scores)``, each ``[bs, budget + 1]`` on the CPU, the root its own parent. The reference they
    are tested against."""
    trees = [
        build_tree(int(root), tokens.numpy(), logprobs.numpy(), budget)
        for root, tokens, logprobs in zip(
            roots.cpu(), top_tokens.cpu(), top_logprobs.cpu(), strict=True
        )
    ]
    return (
        torch.from_numpy(np.stack([t.tokens for t in trees])),
        torch.from_numpy(np.stack([np.maximum(t.parents, 0) for t in trees])),
        torch.from_numpy(np.stack([t.depths for t in trees])),
        torch.from_numpy(np.stack([t.scores for t in trees])),
    )


def head_top_k(
    hidden: torch.Tensor, weight: torch.Tensor, *, vocab: int, top_k: int, chunk_rows: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``top_k`` log-probabilities (float32) and token ids under the head ``weight``.

    ``hidden`` is ``[rows, hidden]``, ``weight`` ``[padded vocab, hidden]`` (rows past ``vocab``
    are padding). Rows go in chunks, as DFlash's greedy head runs: ``bs x (B - 1)`` rows of
    full-vocab float32 logits at once would be a transient the KV pool's sizing never reserved.
    """
    k = min(int(top_k), int(vocab))
    rows = int(hidden.shape[0])
    values = torch.empty((rows, k), dtype=torch.float32, device=hidden.device)
    indices = torch.empty((rows, k), dtype=torch.int64, device=hidden.device)
    for start in range(0, rows, chunk_rows):
        end = min(rows, start + chunk_rows)
        # In the head's dtype, as DFlash casts the draft's hidden states.
        logits = torch.nn.functional.linear(hidden[start:end].to(weight.dtype), weight)
        logits = logits[:, :vocab].float()
        top = torch.topk(logits, k=k, dim=-1)
        values[start:end] = top.values - torch.logsumexp(logits, dim=-1, keepdim=True)
        indices[start:end] = top.indices
    return values, indices


@dataclass(frozen=True)
class TreeNodes:
    """A batch of trees of one width ``W``, node by node (parents before children)."""

    tokens: torch.Tensor  # int64 [bs, W]
    depths: torch.Tensor  # int64 [bs, W]
    parents: torch.Tensor  # int64 [bs, W] (root: 0, its own parent for gathers)
    ancestors: torch.Tensor  # bool [bs, W, W]


@dataclass(frozen=True)
class VerifyLayout(TreeNodes):
    """The trees as SGLang's tree verify takes them: their nodes, positions and mask."""

    positions: torch.Tensor  # int64 [bs * W]: prefix_len + depth
    custom_mask: torch.Tensor  # uint8, sum over requests of W * (prefix_len + W)


def verify_layout(
    trees: Sequence[DraftTree], prefix_lens: Sequence[int], device: torch.device | str = "cpu"
) -> VerifyLayout:
    """Stack ``trees`` (all of one size) into the verify inputs for prefixes ``prefix_lens``."""
    if len(trees) != len(prefix_lens):
        raise ValueError(f"{len(trees)} trees for {len(prefix_lens)} prefixes")
    widths = {tree.size for tree in trees}
    if len(widths) != 1:
        raise ValueError(f"trees of one verify must have one size, got {sorted(widths)}")

    def to(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

    nodes = tree_nodes(
        tokens=to(np.stack([tree.tokens for tree in trees])),
        parents=to(np.stack([np.maximum(tree.parents, 0) for tree in trees])),
        depths=to(np.stack([tree.depths for tree in trees])),
    )
    return layout_from_nodes(
        nodes, prefix_lens=to(np.asarray(prefix_lens, dtype=np.int64)), prefix_lens_cpu=prefix_lens
    )


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """``[bs, W, W]`` bool: row i marks node i and its ancestors, for ``[bs, W]`` parents
    (parents before children, the root its own parent)."""
    bs, width = parents.shape
    # The reflexive closure of "is the parent of", by squaring the one-step relation until it
    # spans the deepest possible path (W - 1 links): a handful of tiny batched matmuls, whatever
    # the tree's shape, on 0/1 values that every float format holds exactly.
    one_step = torch.eye(width, device=parents.device).expand(bs, width, width).clone()
    one_step.scatter_(2, parents[..., None], 1.0)
    reach = one_step
    for _ in range(max(width - 2, 0).bit_length()):
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
    return reach.bool()


def tree_nodes(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor) -> TreeNodes:
    """``[bs, W]`` trees given node by node, with their ancestor matrix."""
    return TreeNodes(
        tokens=tokens, depths=depths, parents=parents, ancestors=ancestor_matrix(parents)
    )


def layout_from_nodes(
    nodes: TreeNodes,
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: Sequence[int] | torch.Tensor,
) -> VerifyLayout:
    """The verify layout of ``nodes`` on their device, without a host sync: ``prefix_lens_cpu``
    (the same lengths on the host) sizes the mask."""
    bs, width = nodes.tokens.shape
    device = nodes.tokens.device
    # The mask is W x (prefix + W) per request, almost all of it the all-visible prefix: it is
    # filled on the device, and only the W x W tree cells are written, so no work grows with
    # the context.
    prefix = prefix_lens.to(torch.int64)
    row_len = prefix + width
    starts = torch.cumsum(width * row_len, 0) - width * row_len
    offsets = torch.arange(width, device=device, dtype=torch.int64)
    tree_cells = (
        starts[:, None, None]
        + offsets[None, :, None] * row_len[:, None, None]
        + prefix[:, None, None]
        + offsets[None, None, :]
    )
    mask_cells = width * (int(sum(int(n) for n in prefix_lens_cpu)) + bs * width)
    custom_mask = torch.ones(mask_cells, dtype=torch.uint8, device=device)
    custom_mask[tree_cells.reshape(-1)] = nodes.ancestors.reshape(-1).to(torch.uint8)
    return VerifyLayout(
        tokens=nodes.tokens,
        depths=nodes.depths,
        parents=nodes.parents,
        ancestors=nodes.ancestors,
        positions=(prefix[:, None] + nodes.depths).reshape(-1),
        custom_mask=custom_mask,
    )


def best_first_nodes(
    roots: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor, budget: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``build_tree`` for a batch, on the tensors' device and without a host sync.

    ``roots`` is ``[bs]``, ``top_tokens``/``top_logprobs`` ``[bs, depth, k]`` (each depth's
    candidates, most likely first). Returns ``(tokens, parents, depths, scores)``, each
    ``[bs, budget + 1]``, nodes in descending score (the root first, its own parent).

    The ``budget`` best paths hold, at each depth, that depth's best paths, and those are
    children of the depth above's best ``budget``: a path's parent scores at least as much,
    and each of ``budget`` better parents would have a first child better than it. So each
    depth keeps its ``budget`` best of (kept parents x k) candidates, and the tree is the best
    ``budget`` of all depths' kept paths. Scores are float64 sums, as ``build_tree`` adds them,
    so the trees are the same wherever no two scores tie; on ties a shallower path, then an
    earlier one of its depth, goes first (``build_tree`` breaks them by discovery order).
    """
    bs, depth, top_k = top_logprobs.shape
    if budget > max_tree_nodes(depth, top_k):
        raise ValueError(
            f"budget {budget} exceeds the {max_tree_nodes(depth, top_k)} paths of depth "
            f"{depth} with {top_k} candidates each"
        )
    logprobs = top_logprobs.to(torch.float64)
    zero = torch.zeros((bs, 1), dtype=torch.int64, device=logprobs.device)
    root = roots.view(bs, 1).to(torch.int64)
    if budget == 0 or depth == 0:
        return root, zero, zero, zero.to(torch.float64)
    level_scores, level_parents, level_tokens = [], [], []
    scores = torch.zeros((bs, 1), dtype=torch.float64, device=logprobs.device)
    for level in range(min(depth, budget)):
        # (kept parents x k) candidates, parent-major; a stable sort keeps that order on ties.
        candidates = (scores[:, :, None] + logprobs[:, level, None, :]).reshape(bs, -1)
        order = torch.sort(candidates, dim=1, descending=True, stable=True).indices[:, :budget]
        scores = torch.gather(candidates, 1, order)
        level_scores.append(scores)
        level_parents.append(order // top_k)  # the parent's slot in the level above
        level_tokens.append(torch.gather(top_tokens[:, level, :], 1, order % top_k))
    # Every kept path, depth-major, then the best `budget` of them (stable: shallower first).
    every_score = torch.cat(level_scores, dim=1)
    chosen = torch.sort(every_score, dim=1, descending=True, stable=True).indices[:, :budget]
    sizes = [s.shape[1] for s in level_scores]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    # Filled on the device: a host tensor copied there would wait for the draft (a sync).
    depth_of = torch.cat(
        [
            torch.full((n,), i + 1, dtype=torch.int64, device=logprobs.device)
            for i, n in enumerate(sizes)
        ]
    )
    # Each kept path's parent as a position in the depth-major list (-1: the root).
    parent_position = torch.cat(
        [
            torch.full_like(level_parents[0], -1),
            *(p + starts[i - 1] for i, p in enumerate(level_parents) if i > 0),
        ],
        dim=1,
    )
    # Node numbers: the root 0, the chosen paths 1..budget in chosen order.
    node_of = torch.zeros((bs, every_score.shape[1] + 1), dtype=torch.int64, device=logprobs.device)
    node_of[:, 1:].scatter_(
        1, chosen, torch.arange(1, budget + 1, device=logprobs.device).expand(bs, budget)
    )
    chosen_parent = torch.gather(parent_position, 1, chosen)
    parents = torch.gather(node_of, 1, chosen_parent + 1)  # position -1 -> column 0 -> the root
    return (
        torch.cat([root, torch.gather(torch.cat(level_tokens, 1), 1, chosen)], 1),
        torch.cat([zero, parents], 1),
        torch.cat([zero, depth_of[chosen]], 1),
        torch.cat([zero.to(torch.float64), torch.gather(every_score, 1, chosen)], 1),
    )


@dataclass(frozen=True)
class Acceptance:
    """The greedy walk's result, per request of a batch of width ``W``."""

    accept_lens: torch.Tensor  # int64 [bs]: draft nodes accepted (the deepest accepted depth)
    chain_index: torch.Tensor  # int64 [bs, W]: tree index of the path node at depth j (0 past it)
    bonus: torch.Tensor  # int64 [bs]: the target's token after the accepted path
    out_tokens: torch.Tensor  # int64 [bs, W]: accepted draft tokens, then the bonus, then 0
    commit_lens: torch.Tensor  # int32 [bs]: accept_lens + 1


def accept_greedy(layout: TreeNodes, target_predict: torch.Tensor) -> Acceptance:
    """Walk each tree along the target's own greedy tokens (``target_predict`` is ``[bs, W]``).

    A node is accepted when its token is what the target predicts after its parent and its
    parent is accepted. Siblings hold distinct tokens (ranks of one distribution), so the
    accepted nodes form one path from the root. Device-side and sync-free: no ``.item()``.
    """
    tokens, parents, depths, ancestors = (
        layout.tokens,
        layout.parents,
        layout.depths,
        layout.ancestors,
    )
    bs, width = tokens.shape
    predict = target_predict.view(bs, width).to(torch.int64)
    matches = tokens == torch.gather(predict, 1, parents)
    matches[:, 0] = True
    accepted = ~(ancestors & ~matches[:, None, :]).any(dim=-1)
    # The deepest accepted node; depths are unique along the accepted path.
    best = torch.argmax(torch.where(accepted, depths, -1), dim=1)
    accept_lens = torch.gather(depths, 1, best[:, None]).squeeze(1)
    on_path = torch.gather(ancestors, 1, best[:, None, None].expand(bs, 1, width)).squeeze(1)
    chain_index = torch.zeros((bs, width), dtype=torch.int64, device=tokens.device)
    node_ids = torch.arange(width, device=tokens.device).expand(bs, width)
    chain_index.scatter_(1, torch.where(on_path, depths, 0), torch.where(on_path, node_ids, 0))
    bonus = torch.gather(predict, 1, best[:, None]).squeeze(1)
    chain_tokens = torch.gather(tokens, 1, chain_index)
    column = torch.arange(width, device=tokens.device)[None, :]
    out_tokens = torch.where(column < accept_lens[:, None], chain_tokens.roll(-1, dims=1), 0)
    out_tokens.scatter_(1, accept_lens[:, None], bonus[:, None])
    return Acceptance(
        accept_lens=accept_lens,
        chain_index=chain_index,
        bonus=bonus,
        out_tokens=out_tokens,
        commit_lens=(accept_lens + 1).to(torch.int32),
    )


def chain_rows(acceptance: Acceptance) -> torch.Tensor:
    """Flat verify rows of each request's path, depth by depth (the root's row past the path):
    the rows a DFlash block would have had, for the logprob pass and the draft's KV."""
    bs, width = acceptance.chain_index.shape
    base = torch.arange(bs, device=acceptance.chain_index.device)[:, None] * width
    return (base + acceptance.chain_index).reshape(-1)


def accepted_kv_moves(
    window: torch.Tensor, acceptance: Acceptance
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(targets, sources)`` KV slots that put the path's node at depth ``j`` into slot ``j`` of
    the request's verify window (``window`` is ``[bs, W]``, node i's KV in slot i).

    Static shapes for every batch: past the path a slot moves onto itself. A source can also be a
    target: SGLang's MLA pool gathers every source before it writes, and its MHA pools' copy
    kernel loads its locations before storing them, but in chunks of 128 or 256 locations, one
    after another. That is safe too: the path's node at depth ``j`` is tree node ``>= j``
    (parents precede children), so a move reads its request's column ``j`` or one to the right
    and writes column ``j``, and a later chunk never reads what an earlier one wrote.
    """
    column = torch.arange(window.shape[1], device=window.device)[None, :]
    on_path = column <= acceptance.accept_lens[:, None]
    sources = torch.where(on_path, torch.gather(window, 1, acceptance.chain_index), window)
    return window.reshape(-1), sources.reshape(-1)


def search_nodes(
    roots: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor, budget: int
) -> TreeNodes:
    """``best_first_nodes``'s trees with their ancestor matrix."""
    tokens, parents, depths, _ = best_first_nodes(roots, top_tokens, top_logprobs, budget)
    return tree_nodes(tokens, parents, depths)


@dataclass(frozen=True)
class AcceptedStep:
    """The acceptance walk's result with what the worker derives from it."""

    acceptance: Acceptance
    rows: torch.Tensor  # chain_rows: the path's verify rows, depth by depth
    kv_targets: torch.Tensor  # accepted_kv_moves: slots the path's KV moves to ...
    kv_sources: torch.Tensor  # ... and the slots it moves from


def accept_step(nodes: TreeNodes, predict: torch.Tensor, window: torch.Tensor) -> AcceptedStep:
    """Walk the trees along the target's greedy tokens; the path's rows and KV moves."""
    acceptance = accept_greedy(nodes, predict)
    targets, sources = accepted_kv_moves(window, acceptance)
    return AcceptedStep(acceptance, chain_rows(acceptance), targets, sources)
