"""The long-context corpus: retrieval prompts at fixed context lengths, generated from a seed.

The kernel earns its keep at 32k-200k tokens of prefix, so the gate must replay prompts that
long. Shipping them would take megabytes; instead they are generated, deterministically (the
same seed and sizes give the same bytes, so the same corpus sha256), from nothing but this
module: each prompt is a synthetic archive of records (words drawn from a seeded list), with
one "needle" record whose code the closing question asks for, placed at a depth that varies
from prompt to prompt (10 %, 50 %, 90 % of the prompt), so a fault that loses or mixes up a KV
row deep in the prefix changes the answer.

Sizes are token counts. Without a tokenizer a prompt is ``text`` of ``tokens - 1`` ASCII bytes:
exactly ``tokens`` for a byte-level tokenizer with a BOS (the reference engine), and an upper
bound for any byte-level BPE (a real model sees fewer tokens; the report shows how many the
server counted). With a tokenizer (``kdtree-parity corpus long --tokenizer MODEL_DIR``) a prompt
is ``input_ids`` of exactly ``tokens`` ids, the pieces tokenized separately and joined.

The prompts of a shipped corpus (``default`` unless told otherwise) come first, tagged as they
are, so one corpus covers short and long contexts; every generated entry is tagged ``long``,
``ctx-<bucket>`` and ``depth-<percent>``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

# About 1k, 8k, 32k and 128k tokens of prompt, and the 200k of the Kimi deployment.
DEFAULT_BUCKETS: tuple[int, ...] = (1024, 8192, 32768, 131072, 200000)
DEFAULT_PER_BUCKET = 3
DEFAULT_SEED = 49
DEPTHS: tuple[float, ...] = (0.1, 0.5, 0.9)
DEFAULT_BASE = "default"

Encoder = Callable[[str], list[int]]

_SYLLABLES = [
    "ka",
    "ri",
    "mo",
    "ten",
    "sul",
    "vor",
    "eth",
    "lan",
    "dro",
    "pim",
    "qua",
    "zel",
    "hob",
    "nir",
    "tas",
    "gul",
    "fen",
    "rox",
    "bai",
    "mir",
    "cor",
    "dun",
    "esk",
    "fal",
    "gri",
    "hul",
    "ilv",
    "jor",
    "kem",
    "lud",
]


def bucket_label(tokens: int) -> str:
    """1024 -> '1k', 131072 -> '128k', 200000 -> '200k', 700 -> '700'."""
    if tokens >= 1000 and tokens % 1024 == 0:
        return f"{tokens // 1024}k"
    if tokens >= 1000 and tokens % 1000 == 0:
        return f"{tokens // 1000}k"
    return str(tokens)


class _Archive:
    """Seeded words and records: the haystack, the needle and the question."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words = sorted(
            {"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))) for _ in range(600)}
        )

    def word(self) -> str:
        return self.rng.choice(self.words)

    def record(self, number: int) -> str:
        w = self.word
        return (
            f"Record {number:06d}: the {w()} {w()} shelf holds {self.rng.randint(2, 999)} "
            f"volumes on {w()} and {w()}; keeper {w().title()} {w().title()}, room "
            f"{self.rng.randint(100, 999)}-{self.rng.choice('ABCDEFGH')}.\n"
        )

    def haystack(self, chars: int) -> str:
        parts, size, number = [], 0, 0
        while size < chars:
            parts.append(self.record(number))
            size += len(parts[-1])
            number += 1
        return "".join(parts)

    def needle_and_question(self) -> tuple[str, str]:
        vault = f"{self.word()} {self.word()}"
        code = f"{self.rng.randint(0, 999999):06d}"
        needle = f"NOTE: the access code of the {vault} vault is {code}.\n"
        question = (
            f"\nQuestion: what is the access code of the {vault} vault? "
            f"Answer: the access code of the {vault} vault is"
        )
        return needle, question


def _depth_cut(haystack: str, depth: float) -> int:
    """The record boundary nearest ``depth`` of ``haystack`` (the needle goes there)."""
    cut = haystack.rfind("\n", 0, int(depth * len(haystack)))
    return cut + 1


def _text_prompt(archive: _Archive, tokens: int, depth: float) -> str:
    """ASCII text of exactly ``tokens - 1`` bytes (a byte tokenizer adds the BOS)."""
    needle, question = archive.needle_and_question()
    room = tokens - 1 - len(needle) - len(question)
    if room < 0:
        raise ValueError(f"a bucket of {tokens} tokens cannot hold a retrieval prompt")
    haystack = archive.haystack(room)[:room]
    cut = _depth_cut(haystack, depth)
    return haystack[:cut] + needle + haystack[cut:] + question


def _ids_prompt(archive: _Archive, tokens: int, depth: float, encode: Encoder) -> list[int]:
    """Exactly ``tokens`` ids: the haystack tokenized and cut to fit the needle and question."""
    needle, question = archive.needle_and_question()
    needle_ids, question_ids = encode(needle), encode(question)
    room = tokens - len(needle_ids) - len(question_ids)
    if room < 0:
        raise ValueError(f"a bucket of {tokens} tokens cannot hold a retrieval prompt")
    # Tokens of these records are far shorter than 16 characters: both sides have enough.
    haystack = archive.haystack(room * 16 + 64)
    cut = _depth_cut(haystack, depth)
    want_before = round(depth * room)
    before, after = encode(haystack[:cut]), encode(haystack[cut:])
    if len(before) < want_before or len(after) < room - want_before:
        raise ValueError(f"the tokenizer made too few tokens of {len(haystack)} characters")
    before, after = before[len(before) - want_before :], after[: room - want_before]
    return before + needle_ids + after + question_ids


def generate_entries(
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    per_bucket: int = DEFAULT_PER_BUCKET,
    seed: int = DEFAULT_SEED,
    encode: Encoder | None = None,
) -> list[dict]:
    """The generated entries (corpus JSON objects), bucket by bucket, depths cycling."""
    if per_bucket < 1 or not buckets or any(b < 1 for b in buckets):
        raise ValueError("need at least one bucket of >= 1 token and per_bucket >= 1")
    rng = random.Random(seed)
    archive = _Archive(rng)
    entries = []
    for tokens in buckets:
        label = bucket_label(tokens)
        for i in range(per_bucket):
            depth = DEPTHS[i % len(DEPTHS)]
            entry: dict = {"id": f"long-{label}-{i:03d}"}
            if encode is None:
                entry["text"] = _text_prompt(archive, tokens, depth)
            else:
                entry["input_ids"] = _ids_prompt(archive, tokens, depth, encode)
            entry["tags"] = ["long", f"ctx-{label}", f"depth-{round(depth * 100)}"]
            entries.append(entry)
    return entries


def long_corpus_jsonl(
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    per_bucket: int = DEFAULT_PER_BUCKET,
    seed: int = DEFAULT_SEED,
    encode: Encoder | None = None,
    base: str | Path | None = DEFAULT_BASE,
) -> bytes:
    """The whole corpus as JSONL bytes: ``base``'s lines (a corpus path or shipped name; None
    for none) as they are, then the generated entries."""
    lines: list[str] = []
    if base is not None:
        from kdtree_parity.corpus import load_corpus

        lines = [line for line in load_corpus(base).raw.decode("utf-8").splitlines() if line]
    lines += [
        json.dumps(e, ensure_ascii=False)
        for e in generate_entries(buckets, per_bucket, seed, encode)
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def tokenizer_encoder(model_dir: str) -> Encoder:
    """An encoder from a model directory's Hugging Face tokenizer (no special tokens added).
    ``transformers`` is imported here only: the gate itself does not need it."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "--tokenizer needs the 'transformers' package (pip install transformers)"
        ) from exc
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return encode
