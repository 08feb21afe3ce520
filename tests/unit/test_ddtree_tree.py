"""DDTree's tree: the best-first builder against brute force, the verify layout against SGLang's
tree-verify format (and SGLang's own Triton tree verify reading it), the acceptance walk against a
plain walk."""

import itertools

import numpy as np
import pytest
import torch

from kdtree_inference.ddtree.tree import (
    DraftTree,
    accept_greedy,
    best_first_nodes,
    build_tree,
    build_trees,
    head_top_k,
    layout_from_nodes,
    max_tree_nodes,
    tree_nodes,
    verify_layout,
)
from kdtree_verify.testing import flat_custom_mask, tree_visibility


def draft_distributions(rng, depth, top_k, vocab=50, ties=False):
    """Each depth's top-k candidates, most likely first: distinct tokens, log-probs <= 0."""
    tokens = np.stack([rng.choice(vocab, size=top_k, replace=False) for _ in range(depth)])
    if ties:  # few distinct values, so equal path scores are common
        logprobs = -rng.integers(0, 3, size=(depth, top_k)).astype(np.float64)
    else:
        logprobs = np.log(rng.dirichlet(np.ones(vocab), size=depth))[:, :top_k]
    return tokens, -np.sort(-logprobs, axis=1)


def brute_force_scores(logprobs):
    """Every path's score (rank tuples of length 1..depth), the best first."""
    depth, top_k = logprobs.shape
    scores = [
        sum(logprobs[level, rank] for level, rank in enumerate(ranks))
        for length in range(1, depth + 1)
        for ranks in itertools.product(range(top_k), repeat=length)
    ]
    return sorted(scores, reverse=True)


FIELDS = ("tokens", "parents", "depths", "scores")
"""What the batched searches return, in order."""

CASES = [(depth, top_k) for depth in (1, 2, 3, 4) for top_k in (1, 2, 3, 4)] + [(6, 2), (5, 3)]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(("depth", "top_k"), CASES)
def test_best_first_tree_holds_the_best_paths(depth, top_k, ties):
    rng = np.random.default_rng(depth * 100 + top_k * 10 + ties)
    tokens, logprobs = draft_distributions(rng, depth, top_k, ties=ties)
    every_path = brute_force_scores(logprobs)
    assert len(every_path) == max_tree_nodes(depth, top_k)
    for budget in sorted({1, 2, 3, 5, 8, 16, 31, 64, len(every_path)}):
        tree = build_tree(7, tokens, logprobs, budget)
        n = min(budget, len(every_path))
        assert tree.size == n + 1
        assert (tree.tokens[0], tree.parents[0], tree.depths[0]) == (7, -1, 0)
        # Best-first: the chosen paths' scores are the n best of all paths (ties change which
        # path, never the scores), in the order they were chosen.
        np.testing.assert_allclose(tree.scores[1:], every_path[:n])
        assert np.all(np.diff(tree.scores[1:]) <= 1e-12)
        for node in range(1, tree.size):
            parent = tree.parents[node]
            assert 0 <= parent < node  # prefix-closed, parents first
            assert tree.depths[node] == tree.depths[parent] + 1
            level = tree.depths[node] - 1
            (rank,) = np.flatnonzero(tokens[level] == tree.tokens[node])
            assert tree.scores[node] == pytest.approx(tree.scores[parent] + logprobs[level, rank])
        # Siblings hold distinct tokens, so the target's token picks at most one child.
        for parent in range(tree.size):
            children = tree.tokens[tree.parents == parent]
            assert len(set(children.tolist())) == len(children)


def test_tokens_the_draft_rules_out_stay_last():
    """-inf log-probabilities (a peaked draft in float32) order after every finite path."""
    tokens = np.array([[5, 6, 7], [8, 9, 10]])
    logprobs = np.array([[0.0, -np.inf, -np.inf], [-1.0, -2.0, -np.inf]])
    tree = build_tree(1, tokens, logprobs, 8)
    assert not np.isnan(tree.scores).any()
    assert tree.tokens[1:4].tolist() == [5, 8, 9]  # the finite paths first, best first
    assert np.isneginf(tree.scores[4:]).all() and tree.size == 9


def test_tree_is_deterministic_and_checks_its_inputs():
    rng = np.random.default_rng(3)
    tokens, logprobs = draft_distributions(rng, 4, 3, ties=True)
    a, b = build_tree(1, tokens, logprobs, 20), build_tree(1, tokens, logprobs, 20)
    for field in ("tokens", "parents", "depths", "scores"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert build_tree(1, tokens, logprobs, 0).size == 1
    with pytest.raises(ValueError, match=r"\[depth, k\]"):
        build_tree(1, tokens, logprobs[:, :2], 4)
    with pytest.raises(ValueError, match="non-negative"):
        build_tree(1, tokens, logprobs, -1)


def test_head_top_k_is_the_log_softmax_top_k_in_chunks():
    """Chunked rows, the head's dtype and its padded vocab rows: the same top-k as one
    full-vocab log-softmax over the real vocabulary."""
    gen = torch.Generator().manual_seed(4)
    vocab, padded, hidden_size, rows = 37, 40, 16, 11
    weight = torch.randn(padded, hidden_size, generator=gen)
    weight[vocab:] = 100.0  # padding rows that would win every top-k if read
    hidden = torch.randn(rows, hidden_size, generator=gen, dtype=torch.float64)
    values, indices = head_top_k(hidden, weight, vocab=vocab, top_k=5, chunk_rows=4)
    expected = torch.topk(torch.log_softmax(hidden.float() @ weight[:vocab].T, dim=-1), k=5)
    assert values.dtype == torch.float32 and indices.dtype == torch.int64
    assert values.shape == indices.shape == (rows, 5)
    assert torch.equal(indices, expected.indices)
    torch.testing.assert_close(values, expected.values)
    # More candidates than the vocabulary holds: all of it, best first.
    values, indices = head_top_k(hidden[:2], weight, vocab=vocab, top_k=64)
    assert indices.shape == (2, vocab) and (indices < vocab).all()


def _batched(rng, batch, depth, top_k, ties=False):
    draws = [draft_distributions(rng, depth, top_k, ties=ties) for _ in range(batch)]
    tokens = torch.from_numpy(np.stack([t for t, _ in draws])).to(torch.int64)
    # float32, as the draft's head gives them (build_tree widens each to float64 as it adds)
    logprobs = torch.from_numpy(np.stack([lp for _, lp in draws])).to(torch.float32)
    roots = torch.from_numpy(rng.integers(0, 50, size=batch)).to(torch.int64)
    return roots, tokens, logprobs


@pytest.mark.parametrize(("depth", "top_k"), [(1, 4), (3, 3), (5, 2), (6, 3), (15, 8)])
def test_the_batched_builder_makes_build_trees_trees(depth, top_k):
    """Scores that never tie: the same nodes, in the same order, with the same parents."""
    rng = np.random.default_rng(depth * 10 + top_k)
    roots, tokens, logprobs = _batched(rng, 3, depth, top_k)
    for budget in [b for b in (0, 1, 2, 5, 16, 33, 64) if b <= max_tree_nodes(depth, top_k)]:
        got = best_first_nodes(roots, tokens, logprobs, budget)
        expected = build_trees(roots, tokens, logprobs, budget)
        for field, mine, reference in zip(FIELDS, got, expected, strict=True):
            assert mine.tolist() == reference.tolist(), (budget, field)


@pytest.mark.parametrize(("depth", "top_k"), [(3, 3), (4, 4), (6, 2)])
def test_the_batched_builder_on_ties_keeps_the_best_scores_as_a_tree(depth, top_k):
    rng = np.random.default_rng(depth + top_k)
    roots, tokens, logprobs = _batched(rng, 2, depth, top_k, ties=True)
    for budget in (1, 4, 9, 20):
        node_tokens, parents, depths, scores = best_first_nodes(roots, tokens, logprobs, budget)
        for i in range(2):
            tree = build_tree(int(roots[i]), tokens[i].numpy(), logprobs[i].numpy(), budget)
            assert scores[i].tolist() == tree.scores.tolist()  # the same scores, best first
            for node in range(1, budget + 1):
                parent = int(parents[i, node])
                assert parent < node and depths[i, node] == depths[i, parent] + 1
                # the node's token is a candidate of its depth, and its score its parent's plus
                # that candidate's log-probability
                level = int(depths[i, node]) - 1
                (rank,) = np.flatnonzero(tokens[i, level].numpy() == int(node_tokens[i, node]))
                expected = float(scores[i, parent]) + float(logprobs[i, level, rank])
                assert float(scores[i, node]) == expected


@pytest.mark.parametrize(
    ("depth", "top_k", "budget"), [(5, 3, 9), (15, 1, 15), (16, 1, 16), (15, 8, 64), (2, 2, 1)]
)
def test_the_batched_builders_layout_equals_the_host_layout(depth, top_k, budget):
    """Bushy trees and single chains as deep as the width allows (the ancestor closure's
    longest path)."""
    rng = np.random.default_rng(21)
    roots, tokens, logprobs = _batched(rng, 3, depth, top_k)
    prefix_lens = [0, 5, 17]
    trees = [
        build_tree(int(roots[i]), tokens[i].numpy(), logprobs[i].numpy(), budget) for i in range(3)
    ]
    host = verify_layout(trees, prefix_lens)
    node_tokens, parents, depths, _ = best_first_nodes(roots, tokens, logprobs, budget)
    batched = layout_from_nodes(
        tree_nodes(node_tokens, parents, depths),
        torch.tensor(prefix_lens),
        prefix_lens_cpu=prefix_lens,
    )
    for field in ("tokens", "depths", "parents", "ancestors", "positions", "custom_mask"):
        assert torch.equal(getattr(batched, field), getattr(host, field)), field
    assert torch.equal(
        host.ancestors, torch.from_numpy(np.stack([tree.ancestors() for tree in trees]))
    )


def test_the_batched_builder_refuses_a_budget_past_every_path():
    roots, tokens, logprobs = _batched(np.random.default_rng(0), 1, 2, 2)
    with pytest.raises(ValueError, match="budget 7 exceeds the 6 paths"):
        best_first_nodes(roots, tokens, logprobs, 7)


def random_trees(rng, batch, budget, depth=5, top_k=3):
    trees = []
    for _ in range(batch):
        tokens, logprobs = draft_distributions(rng, depth, top_k)
        trees.append(build_tree(int(rng.integers(0, 50)), tokens, logprobs, budget))
    return trees


def test_layout_is_sglangs_tree_verify_format():
    rng = np.random.default_rng(5)
    trees = random_trees(rng, 3, budget=9)
    prefix_lens = [0, 5, 17]
    layout = verify_layout(trees, prefix_lens)
    visibilities = [tree_visibility(tree.parents.tolist()) for tree in trees]
    expected_mask, _ = flat_custom_mask(prefix_lens, visibilities, torch.uint8)
    assert layout.custom_mask.dtype == torch.uint8
    assert torch.equal(layout.custom_mask, expected_mask)
    expected_positions = np.concatenate(
        [p + tree.depths for p, tree in zip(prefix_lens, trees, strict=True)]
    )
    assert layout.positions.tolist() == expected_positions.tolist()
    assert layout.tokens.shape == (3, 10)
    with pytest.raises(ValueError, match="one size"):
        verify_layout([trees[0], build_tree(1, np.zeros((1, 1)), np.zeros((1, 1)), 1)], [0, 0])


def test_sglangs_triton_tree_verify_reads_the_layout():
    """SGLang's own ``extend_attention_fwd`` (its tree verify, CPU interpreter) over the layout
    equals attention where each node sees the prefix and its ancestors."""
    from kdtree_verify.metadata import VerifyMetadata
    from kdtree_verify.testing import QK_DIM, V_DIM, sglang_extend_attention

    rng = np.random.default_rng(11)
    gen = torch.Generator().manual_seed(11)
    trees = random_trees(rng, 2, budget=6)
    prefix_lens, width, heads = [4, 9], 7, 2
    layout = verify_layout(trees, prefix_lens)
    pool = sum(prefix_lens) + 2 * width
    k_buffer = torch.randn(pool, 1, QK_DIM, generator=gen)
    slots = torch.randperm(pool, generator=gen)
    kv_indices, out_cache_loc = slots[: sum(prefix_lens)], slots[sum(prefix_lens) :]
    q = torch.randn(2 * width, heads, QK_DIM, generator=gen)
    k_extend = k_buffer[out_cache_loc].clone()
    mask_indptr = torch.tensor(
        [0, *np.cumsum([width * (p + width) for p in prefix_lens]).tolist()], dtype=torch.int64
    )
    metadata = VerifyMetadata.build(
        torch.arange(3, dtype=torch.int64) * width,
        torch.tensor([0, prefix_lens[0], sum(prefix_lens)], dtype=torch.int64),
        kv_indices,
        layout.custom_mask,
        mask_indptr,
        0.1,
    )
    out = sglang_extend_attention(
        metadata, q, k_extend, k_extend[..., :V_DIM], k_buffer, k_buffer[..., :V_DIM]
    )
    start = 0
    for b, (tree, prefix) in enumerate(zip(trees, prefix_lens, strict=True)):
        keys = torch.cat(
            [k_buffer[kv_indices[start : start + prefix], 0], k_extend[b * width :][:width, 0]]
        )
        start += prefix
        visible = torch.cat(
            [torch.ones(width, prefix, dtype=torch.bool), torch.from_numpy(tree.ancestors())], dim=1
        )
        for row in range(width):
            scores = 0.1 * q[b * width + row] @ keys.T  # [heads, keys]
            scores[:, ~visible[row]] = float("-inf")
            expected = torch.softmax(scores, dim=-1) @ keys[:, :V_DIM]
            torch.testing.assert_close(out[b * width + row], expected, rtol=2e-5, atol=2e-5)


def walk(tree: DraftTree, predict: list[int]) -> tuple[list[int], int]:
    """The plain greedy walk: follow the child whose token the target predicts."""
    node, path = 0, [0]
    while True:
        children = [c for c in range(tree.size) if tree.parents[c] == node]
        nxt = [c for c in children if tree.tokens[c] == predict[node]]
        if not nxt:
            return path, predict[node]
        node = nxt[0]
        path.append(node)


@pytest.mark.parametrize("seed", range(6))
def test_acceptance_walk_matches_the_plain_walk(seed):
    rng = np.random.default_rng(seed)
    trees = random_trees(rng, 4, budget=12, depth=5, top_k=2)
    layout = verify_layout(trees, [3, 0, 8, 1])
    width = trees[0].size
    predict = rng.integers(0, 50, size=(4, width))
    for b, tree in enumerate(trees):  # follow a random root-to-node path for a while
        target = int(rng.integers(0, width))
        node = target
        while node > 0:
            predict[b, tree.parents[node]] = tree.tokens[node]
            node = tree.parents[node]
    result = accept_greedy(layout, torch.from_numpy(predict))
    for b, tree in enumerate(trees):
        path, bonus = walk(tree, predict[b].tolist())
        accepted = len(path) - 1
        assert result.accept_lens[b] == accepted
        assert result.commit_lens[b] == accepted + 1
        assert result.bonus[b] == bonus
        assert result.chain_index[b, : accepted + 1].tolist() == path
        assert result.out_tokens[b, :accepted].tolist() == tree.tokens[path[1:]].tolist()
        assert result.out_tokens[b, accepted] == bonus
        assert result.out_tokens[b, accepted + 1 :].eq(0).all()


def test_accepted_kv_moves_compact_the_path_in_sglangs_mla_pool():
    """SGLang's own MLA KV pool (CPU) after the moves: slot j of each window holds the KV the
    verify wrote for the path's node at depth j; slots past the path are untouched."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    from kdtree_inference.ddtree.tree import accepted_kv_moves, chain_rows

    rng = np.random.default_rng(2)
    trees = random_trees(rng, 3, budget=10, depth=4, top_k=3)
    layout = verify_layout(trees, [5, 0, 2])
    width = trees[0].size
    # Request 0 accepts one node, request 1 its deepest path, request 2 nothing: 99 is no draft
    # token, so the walk stops where the target's tokens stop leading along the chosen path.
    predict = np.full((3, width), 99)
    targets = [1, int(np.argmax(trees[1].depths)), 0]
    for b, (tree, node) in enumerate(zip(trees, targets, strict=True)):
        while node > 0:
            predict[b, tree.parents[node]] = tree.tokens[node]
            node = tree.parents[node]
    acceptance = accept_greedy(layout, torch.from_numpy(predict))
    expected = [int(trees[b].depths[node]) for b, node in enumerate(targets)]
    assert acceptance.accept_lens.tolist() == expected and expected[1] > 1
    pool = MLATokenToKVPool(
        size=64,
        page_size=1,
        dtype=torch.float32,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )
    for layer in range(2):
        buffer = pool.get_key_buffer(layer)
        buffer.copy_(torch.randn(buffer.shape))
    window = torch.from_numpy(rng.permutation(60)[: 3 * width].reshape(3, width)).to(torch.int64)
    before = [pool.get_key_buffer(layer).clone() for layer in range(2)]
    pool.move_kv_cache(*accepted_kv_moves(window, acceptance))
    for layer in range(2):
        after = pool.get_key_buffer(layer)
        for b in range(3):
            accepted = int(acceptance.accept_lens[b])
            for j in range(width):
                node = int(acceptance.chain_index[b, j]) if j <= accepted else j
                assert torch.equal(after[window[b, j]], before[layer][window[b, node]]), (b, j)
    # The path's verify rows, depth by depth, as a DFlash block lays them out.
    rows = chain_rows(acceptance).view(3, width)
    for b in range(3):
        assert rows[b, 0] == b * width
        assert rows[b, : int(acceptance.accept_lens[b]) + 1].tolist() == [
            b * width + int(i)
            for i in acceptance.chain_index[b, : int(acceptance.accept_lens[b]) + 1]
        ]


@pytest.mark.parametrize("chunk", [1, 2, 5, 7])
def test_accepted_kv_moves_survive_a_chunked_copy(chunk):
    """The moves applied in consecutive chunks (each gathering before it writes, as SGLang's MHA
    copy kernel does past one chunk of locations) equal the moves applied at once."""
    from kdtree_inference.ddtree.tree import accepted_kv_moves

    rng = np.random.default_rng(chunk)
    trees = random_trees(rng, 4, budget=12, depth=5, top_k=2)
    layout = verify_layout(trees, [0, 3, 1, 6])
    width = trees[0].size
    predict = rng.integers(0, 50, size=(4, width))
    for b, tree in enumerate(trees):  # lead each walk to its deepest node
        node = int(np.argmax(tree.depths))
        while node > 0:
            predict[b, tree.parents[node]] = tree.tokens[node]
            node = tree.parents[node]
    acceptance = accept_greedy(layout, torch.from_numpy(predict))
    assert (acceptance.accept_lens > 1).all()
    window = torch.from_numpy(rng.permutation(80)[: 4 * width].reshape(4, width)).to(torch.int64)
    targets, sources = accepted_kv_moves(window, acceptance)
    kv = torch.randn(80, 3)
    at_once = kv.clone()
    at_once[targets] = at_once[sources]
    chunked = kv.clone()
    for start in range(0, targets.numel(), chunk):
        chunked[targets[start : start + chunk]] = chunked[sources[start : start + chunk]]
    assert torch.equal(chunked, at_once)
