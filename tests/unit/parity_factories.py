"""Hand-built prompt results for the parity unit tests (real data classes, no mocks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kdtree_parity.compare import compare_generations
from kdtree_parity.corpus import CorpusEntry
from kdtree_parity.generation import Generation, TopLogprob
from kdtree_parity.results import Outcome, PromptResult, RequestError


def generation(ids: list[int], logprob: float = -0.1, alt: int | None = None) -> Generation:
    """Every position's top-k: the chosen token, then ``alt`` (or token+1) 0.01 nats lower."""
    tops = []
    for t in ids:
        other = alt if alt is not None and alt != t else t + 1
        tops.append((TopLogprob(t, logprob, chr(65 + t % 26)), TopLogprob(other, logprob - 0.01)))
    return Generation(
        output_ids=tuple(ids),
        token_logprobs=tuple(logprob for _ in ids),
        top_logprobs=tuple(tops),
        token_texts=tuple(chr(65 + t % 26) for t in ids),
        finish_reason="length",
        text="".join(chr(65 + t % 26) for t in ids),
    )


def ok(g: Generation) -> Outcome:
    return Outcome(g, None, 1, 0.01)


def failed(kind: str = "connect", status: int | None = None) -> Outcome:
    return Outcome(None, RequestError(kind, f"{kind} failure", status), 4, 1.0)


def result(
    pid: str,
    baseline: Outcome,
    candidate: Outcome,
    aa: Outcome | None = None,
    epsilon: float = 0.05,
) -> PromptResult:
    aa = aa or baseline
    outcomes = {"baseline": baseline, "candidate": candidate, "aa": aa}
    base, cand, twin = baseline.generation, candidate.generation, aa.generation
    return PromptResult(
        entry=CorpusEntry(id=pid, text=f"prompt {pid}", tags=("t",), line=1),
        outcomes=outcomes,
        candidate=None
        if base is None or cand is None
        else compare_generations(base, cand, epsilon),
        aa=None if base is None or twin is None else compare_generations(base, twin, epsilon),
    )


def exact(pid: str) -> PromptResult:
    g = ok(generation([1, 2, 3, 4]))
    return result(pid, g, g)


def hard(pid: str) -> PromptResult:
    # The candidate picks 9, which the baseline's top-k does not contain.
    return result(pid, ok(generation([1, 2, 3, 4])), ok(generation([1, 2, 9, 9])))


def near_tie(pid: str) -> PromptResult:
    # Token 3 vs 4: each in the other's top-k, 0.01 nats apart on both sides.
    base = generation([1, 2, 3, 5], alt=4)
    cand = generation([1, 2, 4, 5], alt=3)
    return result(pid, ok(base), ok(cand))


def run_parity_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """``python -m kdtree_parity.cli ARGS`` as a user runs it, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "kdtree_parity.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
