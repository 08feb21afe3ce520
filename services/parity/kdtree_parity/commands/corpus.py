"""``kdtree-parity corpus long --out FILE``: write the long-context corpus (retrieval prompts in
context-length buckets, generated from a fixed seed) to a JSONL file."""

from __future__ import annotations

import argparse
from pathlib import Path

from kdtree_parity import long_corpus
from kdtree_parity.commands.options import console, results
from kdtree_parity.corpus import CorpusError, parse_corpus
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.settings import ParitySettings

HELP = (
    "write the long-context corpus (retrieval prompts in context-length buckets, "
    "generated from a fixed seed) to a JSONL file"
)


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    parser.add_argument("kind", choices=("long",), help="the corpus to generate")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument(
        "--buckets",
        type=token_counts,
        default=long_corpus.DEFAULT_BUCKETS,
        help="prompt lengths in tokens, comma-separated (default "
        f"{','.join(map(str, long_corpus.DEFAULT_BUCKETS))})",
    )
    parser.add_argument(
        "--per-bucket", type=int, default=long_corpus.DEFAULT_PER_BUCKET, help="prompts per bucket"
    )
    parser.add_argument("--seed", type=int, default=long_corpus.DEFAULT_SEED)
    parser.add_argument(
        "--tokenizer",
        help="a model directory: write input_ids of exactly each bucket's length in this "
        "model's tokens (default: text, sized in bytes: exact for byte-level tokenizers)",
    )
    parser.add_argument(
        "--base",
        default=long_corpus.DEFAULT_BASE,
        help="corpus whose prompts come first (a path or shipped name; 'none' for none)",
    )


def token_counts(value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(
            f"expected positive token counts like 1024,8192: {value!r}"
        )
    return counts


def run(args: argparse.Namespace) -> int:
    """Write the generated corpus; stdout names the file, its prompts and its sha256."""
    try:
        encode = long_corpus.tokenizer_encoder(args.tokenizer) if args.tokenizer else None
        data = long_corpus.long_corpus_jsonl(
            args.buckets,
            args.per_bucket,
            args.seed,
            encode,
            base=None if args.base == "none" else args.base,
        )
        corpus = parse_corpus(data, source=args.out)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    except (CorpusError, ValueError, RuntimeError, OSError) as exc:
        console.print(f"[red]kdtree-parity corpus: {exc}", highlight=False)
        return ExitCode.ERROR
    longest = max(e.max_prompt_tokens for e in corpus.entries)
    results.print(
        f"{out}: {len(corpus)} prompts, the longest {longest} tokens at most, "
        f"sha256 {corpus.sha256}",
        highlight=False,
    )
    return ExitCode.PASSED
