"""DDTree's device tree search on CUDA: the same trees and layout as on the CPU (where the unit tests
hold them to ``build_tree``), both searches (``torch``'s sorts and ``triton``'s heap kernel) as
CUDA graphs, and no host sync from the draft's top-k to the accepted path."""

import pytest
import torch

from kdtree_inference.ddtree.heap_search import best_first_heap
from kdtree_inference.ddtree.step_graphs import TreeStepGraphs, tree_search
from kdtree_inference.ddtree.tree import (
    accept_step,
    best_first_nodes,
    build_trees,
    layout_from_nodes,
    tree_nodes,
)

SEARCHES = ["torch", "triton"]
FIELDS = ("tokens", "parents", "depths", "scores")  # what the batched searches return

DEPTH, TOP_K = 15, 8  # DFlash's block of 16 and the default top-k


def draft_top_k(batch: int, seed: int, device: str):
    """Each depth's top-k as the draft's head gives them: float32 log-probs, best first."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, DEPTH, 4096, generator=gen) * 3
    values, indices = torch.log_softmax(logits, -1).topk(TOP_K, dim=-1)
    roots = torch.randint(0, 4096, (batch,), generator=gen)
    return roots.to(device), indices.to(device), values.to(device)


@pytest.mark.parametrize("budget", [1, 8, 16, 32, 64])
def test_the_device_search_equals_the_cpu_search(budget):
    prefix_lens = [0, 1000, 45000, 7]
    cpu = best_first_nodes(*draft_top_k(4, budget, "cpu"), budget)
    cuda = best_first_nodes(*draft_top_k(4, budget, "cuda"), budget)
    for host, device in zip(cpu, cuda, strict=True):
        assert torch.equal(host, device.cpu())
    layouts = [
        layout_from_nodes(
            tree_nodes(*nodes[:3]), torch.tensor(prefix_lens, device=device), prefix_lens
        )
        for nodes, device in ((cpu, "cpu"), (cuda, "cuda"))
    ]
    for field in ("tokens", "parents", "depths", "ancestors", "positions", "custom_mask"):
        assert torch.equal(getattr(layouts[0], field), getattr(layouts[1], field).cpu()), field


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_the_heap_kernel_makes_build_trees_trees_on_the_gpu(ties):
    """Compiled for this GPU (the unit tests run it interpreted): build_tree's nodes, parents,
    depths and float64 scores for every request, ties included."""
    roots, tokens, logprobs = draft_top_k(8, 7, "cpu")
    if ties:
        logprobs = logprobs.round()  # a few distinct values: equal path scores are common
    for budget in (1, 8, 16, 33, 64):
        got = best_first_heap(roots.cuda(), tokens.cuda(), logprobs.cuda(), budget)
        expected = build_trees(roots, tokens, logprobs, budget)
        for field, mine, reference in zip(FIELDS, got, expected, strict=True):
            assert mine.cpu().tolist() == reference.tolist(), (budget, field)


def deep_predictions(nodes, seed: int) -> torch.Tensor:
    """Target predictions that accept each tree along first children as deep as it goes (a
    random walk would stop at the root most of the time): after node i, its first child's
    token; after a leaf, a random token."""
    tokens, parents = nodes.tokens.cpu(), nodes.parents.cpu()
    bs, width = tokens.shape
    predict = torch.randint(0, 4096, (bs, width), generator=torch.Generator().manual_seed(seed))
    for b in range(bs):
        for child in range(width - 1, 0, -1):  # the lowest-numbered child is written last
            predict[b, parents[b, child]] = tokens[b, child]
    return predict.cuda()


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("budget", [1, 16, 64])
@pytest.mark.parametrize("batch_sizes", [[1, 1, 1], [8, 8, 8], [1, 8, 3, 8, 1, 3, 8]])
def test_the_graphs_replay_what_the_eager_step_computes(budget, batch_sizes, search):
    """Steps through the graphs (a capture at each batch size's first step, replays on new
    inputs after it, batch sizes interleaved in one shared pool) against the eager functions;
    what a step hands on survives the next steps' replays."""
    search_nodes = tree_search(search)
    graphs = TreeStepGraphs(budget, search_nodes)
    width = budget + 1
    handed_on = []
    for seed, bs in enumerate(batch_sizes):
        roots, tokens, logprobs = draft_top_k(bs, seed, "cuda")
        window = torch.randperm(100_000, device="cuda")[: bs * width].view(bs, width)
        expected_nodes = search_nodes(roots, tokens, logprobs, budget)
        nodes = graphs.search(roots, tokens, logprobs)
        for field in ("tokens", "parents", "depths", "ancestors"):
            assert torch.equal(getattr(nodes, field), getattr(expected_nodes, field)), field
        predict = deep_predictions(expected_nodes, seed)
        expected = accept_step(expected_nodes, predict, window)
        got = graphs.accept(predict, window)
        for field in ("accept_lens", "chain_index", "bonus", "out_tokens", "commit_lens"):
            assert torch.equal(
                getattr(got.acceptance, field), getattr(expected.acceptance, field)
            ), field
        for field in ("rows", "kv_targets", "kv_sources"):
            assert torch.equal(getattr(got, field), getattr(expected, field)), field
        handed_on.append((got.acceptance, expected.acceptance))
    assert int(handed_on[0][1].accept_lens.max()) >= min(budget, 2)  # the walks went deep
    for got, expected in handed_on:
        for field in ("bonus", "out_tokens", "commit_lens", "accept_lens"):
            assert torch.equal(getattr(got, field), getattr(expected, field)), field


def test_the_graphs_refuse_what_they_were_not_captured_for():
    graphs = TreeStepGraphs(8)
    with pytest.raises(RuntimeError, match="before its tree search"):
        graphs.accept(torch.zeros(2, 9, device="cuda"), torch.zeros(2, 9, device="cuda"))
    roots, tokens, logprobs = draft_top_k(2, 0, "cuda")
    graphs.search(roots, tokens, logprobs)
    with pytest.raises(ValueError, match="graph input of shape"):
        graphs.search(roots, tokens[:, :4], logprobs[:, :4])


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("budget", [16, 64])
def test_the_step_from_top_k_to_the_accepted_path_never_waits_for_the_gpu(budget, search):
    """What the worker runs between the draft and the commit, once its graphs are captured,
    under CUDA's sync check: a synchronizing call raises. The prefix lengths come from the host,
    as the worker reads them once at the step's start."""
    roots, tokens, logprobs = draft_top_k(8, 3, "cuda")
    prefix_cpu = torch.tensor([5, 40, 900, 3000, 17, 128, 45000, 64])
    prefix_lens = prefix_cpu.cuda()
    width = budget + 1
    window = torch.arange(8 * width, device="cuda").view(8, width) + 50_000
    # Random target predictions: the walk's work is the same however far it gets.
    predict = torch.randint(0, 4096, (8, width), device="cuda")
    graphs = TreeStepGraphs(budget, tree_search(search))
    graphs.search(roots, tokens, logprobs)
    graphs.accept(predict, window)  # the captures, with their one synchronize each
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        nodes = graphs.search(roots, tokens, logprobs)
        layout = layout_from_nodes(nodes, prefix_lens, prefix_cpu)
        accepted = graphs.accept(predict, window)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert layout.custom_mask.shape == (width * (int(prefix_cpu.sum()) + 8 * width),)
    assert accepted.rows.shape == (8 * width,)
    assert accepted.kv_targets.is_cuda and accepted.kv_sources.is_cuda
    assert bool((accepted.acceptance.commit_lens >= 1).all())
