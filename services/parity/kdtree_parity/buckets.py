"""Context-length buckets: which prompts are short and which are long, by the targets' count.

A prompt's length is what the baseline reported as ``meta_info.prompt_tokens`` (its own
tokenizer and chat template), else another target's report, else the length of its
``input_ids``; a text prompt no target measured is ``unmeasured``. The buckets are named after
the long corpus's sizes (``long_corpus.DEFAULT_BUCKETS``) and split between them, so a 1,024-token
prompt and one of 1,000 land in ``1k``, and a prompt a real model counts at 52,000 tokens in
``32k``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kdtree_parity.results import ALL_ROLES, PromptResult

# (label, the fewest prompt tokens it holds), in order; a prompt goes to the last that fits.
BUCKETS: tuple[tuple[str, int], ...] = (
    ("short", 0),
    ("1k", 512),
    ("8k", 4096),
    ("32k", 16384),
    ("128k", 65536),
    ("200k", 163840),
)
UNMEASURED = "unmeasured"
LABELS: tuple[str, ...] = (*(label for label, _ in BUCKETS), UNMEASURED)


def prompt_tokens(result: PromptResult) -> int | None:
    """The prompt's length in tokens as the targets counted it (the baseline first)."""
    for role in ALL_ROLES:
        outcome = result.outcomes.get(role)
        generation = outcome.generation if outcome is not None else None
        if generation is not None and generation.prompt_tokens is not None:
            return generation.prompt_tokens
    ids = result.entry.input_ids
    return len(ids) if ids is not None else None


def bucket_of(tokens: int | None) -> str:
    """The bucket of a prompt of ``tokens`` tokens (``unmeasured`` for None)."""
    if tokens is None:
        return UNMEASURED
    label = BUCKETS[0][0]
    for name, low in BUCKETS:
        if tokens >= low:
            label = name
    return label


def by_bucket(results: Sequence[PromptResult]) -> dict[str, list[PromptResult]]:
    """``results`` grouped by bucket, buckets in ``LABELS`` order, empty ones left out."""
    groups: dict[str, list[PromptResult]] = {}
    for result in results:
        groups.setdefault(bucket_of(prompt_tokens(result)), []).append(result)
    return {label: groups[label] for label in LABELS if label in groups}


def longest_prompt(results: Sequence[PromptResult]) -> int | None:
    """The longest prompt the targets measured among ``results`` (None: none measured)."""
    lengths = [n for r in results if (n := prompt_tokens(r)) is not None]
    return max(lengths) if lengths else None
