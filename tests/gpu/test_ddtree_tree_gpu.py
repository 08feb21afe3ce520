"""DDTree's device tree search on CUDA: the same trees and layout as on the CPU (where the unit tests
hold them to ``build_tree``), and no host sync from the draft's top-k to the accepted path."""

import pytest
import torch

from kdtree_inference.ddtree.tree import (
    accept_greedy,
    accepted_kv_moves,
    best_first_nodes,
    chain_rows,
    layout_from_nodes,
)

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
        layout_from_nodes(*nodes[:3], torch.tensor(prefix_lens, device=device), prefix_lens)
        for nodes, device in ((cpu, "cpu"), (cuda, "cuda"))
    ]
    for field in ("tokens", "parents", "depths", "ancestors", "positions", "custom_mask"):
        assert torch.equal(getattr(layouts[0], field), getattr(layouts[1], field).cpu()), field


@pytest.mark.parametrize("budget", [16, 64])
def test_the_step_from_top_k_to_the_accepted_path_never_waits_for_the_gpu(budget):
    """What the worker runs between the draft and the commit, under CUDA's sync check: a
    synchronizing call raises. The prefix lengths come from the host, as the worker reads them
    once at the step's start."""
    roots, tokens, logprobs = draft_top_k(8, 3, "cuda")
    prefix_cpu = torch.tensor([5, 40, 900, 3000, 17, 128, 45000, 64])
    prefix_lens = prefix_cpu.cuda()
    width = budget + 1
    window = torch.arange(8 * width, device="cuda").view(8, width) + 50_000
    # Random target predictions: the walk's work is the same however far it gets.
    predict = torch.randint(0, 4096, (8, width), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        nodes = best_first_nodes(roots, tokens, logprobs, budget)
        layout = layout_from_nodes(*nodes[:3], prefix_lens, prefix_cpu)
        acceptance = accept_greedy(layout, predict)
        rows = chain_rows(acceptance)
        moves = accepted_kv_moves(window, acceptance)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rows.shape == (8 * width,)
    assert all(isinstance(t, torch.Tensor) and t.is_cuda for t in moves)
    assert bool((acceptance.commit_lens >= 1).all())
