"""Prompt-lookup (n-gram) drafter that proposes a *tree* of draft tokens with top-k branching.

At every node the drafter looks up the longest suffix (``ngram_max`` down to ``ngram_min`` tokens)
of the path so far in everything the request has seen (prompt + output), and branches into the
``topk`` most frequent continuations (ties: the most recent). Nodes are expanded breadth-first until
the tree holds exactly ``num_draft_tokens`` nodes, SGLang's fixed per-request draft count; when the
context offers too few continuations the tree is topped up with guesses (frequent tokens as extra
children of the root), which verification simply rejects. The drafter never affects *what* is
generated, only how many tokens a verify step commits: greedy output is lossless by construction.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from .config import SpecConfig


@dataclass(frozen=True)
class DraftTree:
    """Node 0 is the root: the last committed token, whose KV is not in the pool yet.

    ``parents[i]`` < i for i > 0 (topological order), ``depths[i]`` = distance from the root.
    """

    tokens: list[int]
    parents: list[int]

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        depths = [0] * self.size
        for i in range(1, self.size):
            depths[i] = depths[self.parents[i]] + 1
        return depths

    def visibility(self) -> torch.Tensor:
        """[N, N] bool: row i sees column j iff j is i itself or one of its ancestors."""
        n = self.size
        visible = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j >= 0:
                visible[i, j] = True
                j = self.parents[j]
        return visible

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i in range(1, self.size):
            kids[self.parents[i]].append(i)
        return kids


class NgramIndex:
    """Continuation counts of every n-gram (n in [n_min, n_max]) of one growing token sequence."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        # n-gram -> {next token: (count, last position)}
        self._next: dict[tuple[int, ...], dict[int, tuple[int, int]]] = {}
        self._counts: dict[int, int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            pos = len(self.tokens)
            for n in range(self.n_min, self.n_max + 1):
                if pos >= n:
                    key = tuple(self.tokens[pos - n : pos])
                    table = self._next.setdefault(key, {})
                    count, _ = table.get(token, (0, -1))
                    table[token] = (count + 1, pos)
            self.tokens.append(token)
            self._counts[token] = self._counts.get(token, 0) + 1

    def continuations(self, path_suffix: list[int], k: int) -> list[int]:
        """Up to k likely next tokens after ``path_suffix`` (longest matching n-gram wins)."""
        for n in range(min(self.n_max, len(path_suffix)), self.n_min - 1, -1):
            table = self._next.get(tuple(path_suffix[len(path_suffix) - n :]))
            if table:
                ranked = sorted(table.items(), key=lambda item: (-item[1][0], -item[1][1]))
                return [token for token, _ in ranked[:k]]
        return []

    def frequent_tokens(self, k: int) -> list[int]:
        return [t for t, _ in sorted(self._counts.items(), key=lambda item: -item[1])[:k]]


class NgramTreeDrafter:
    def __init__(self, spec: SpecConfig, vocab_size: int) -> None:
        self.spec = spec
        self.vocab_size = vocab_size

    def new_index(self) -> NgramIndex:
        return NgramIndex(self.spec.ngram_min, self.spec.ngram_max)

    def propose(self, index: NgramIndex, root_token: int) -> DraftTree:
        """A tree of exactly ``num_draft_tokens`` nodes rooted at ``root_token``.

        ``index`` holds the committed tokens *before* the root.
        """
        budget = self.spec.num_draft_tokens
        tokens, parents, paths = [root_token], [-1], [[root_token]]
        context_tail = index.tokens[-self.spec.ngram_max :]
        queue = deque([0])
        while queue and len(tokens) < budget:
            node = queue.popleft()
            if len(paths[node]) > self.spec.max_depth:
                continue
            suffix = (context_tail + paths[node])[-self.spec.ngram_max :]
            for token in index.continuations(suffix, self.spec.topk):
                if len(tokens) >= budget:
                    break
                tokens.append(token)
                parents.append(node)
                paths.append([*paths[node], token])
                queue.append(len(tokens) - 1)
        self._top_up(index, tokens, parents, budget)
        return DraftTree(tokens=tokens, parents=parents)

    def _top_up(
        self, index: NgramIndex, tokens: list[int], parents: list[int], budget: int
    ) -> None:
        """Fill the tree to ``budget`` nodes with guessed children of the root."""
        taken = {tokens[i] for i in range(1, len(tokens)) if parents[i] == 0}
        guesses = [t for t in index.frequent_tokens(budget + len(taken)) if t not in taken]
        filler = iter(guesses + [t for t in range(32, self.vocab_size) if t not in taken])
        while len(tokens) < budget:
            token = next(filler)
            if token in taken:
                continue
            taken.add(token)
            tokens.append(token)
            parents.append(0)
