"""Token choice and logprob bookkeeping for one position's logits."""

from __future__ import annotations

import torch


def sample_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    generator: torch.Generator | None,
) -> int:
    """Greedy for temperature 0, else temperature / top-k / top-p / min-p sampling (float32)."""
    if temperature == 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if 0 < top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        drop = cumulative - sorted_probs > top_p * cumulative[-1]
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    if min_p > 0.0:
        probs = torch.where(probs >= min_p * probs.max(), probs, torch.zeros_like(probs))
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def token_logprobs(
    logits: torch.Tensor, token: int, top_n: int
) -> tuple[float, list[tuple[float, int]]]:
    """log p(token) and the top_n (logprob, token id) pairs, from raw (untempered) logits."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[float, int]] = []
    if top_n > 0:
        values, ids = torch.topk(logprobs, min(top_n, logprobs.shape[-1]))
        top = list(zip(values.tolist(), ids.tolist(), strict=True))
    return float(logprobs[token]), top
