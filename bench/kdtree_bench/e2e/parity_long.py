"""Long-context parity on real servers: the gate with the long corpus, judged per bucket.

An off baseline and its A/A' floor serve while two candidates are gated against them with the
long corpus (``kdtree_parity.long_corpus``, written in the model's own tokens): ``on``
(KDTREE_VERIFY=on), which must pass, and ``on`` with ``KDTREE_INJECT_FAULT`` (default
``kv_drop:20000``: the KV row at position 20,000 is lost in every verify forward), which must
fail, and only through the buckets whose prompts reach the fault. SGLang's four servers start
together behind start gates, the reference engines one after another. Writes ``long.json`` and
``long.md`` (verdicts, failing rules, every bucket's status) and the gate's reports under
``runs/`` to OUT::

    python3 -m kdtree_bench.e2e.parity_long --servers sglang --preset rank --model-dir /tmp/models/rank \\
        --buckets 1024,8192,32768,128000 --out $OUT/long                         # GPU machine
    python3 -m kdtree_bench.e2e.parity_long --servers sglang --preset kimi-rank \\
        --model-dir /tmp/models/kimi-rank --buckets 1024,32768,200000 --out $OUT/long-kimi
    python3 -m kdtree_bench.e2e.parity_long --servers engine --buckets 1024,6144 --per-bucket 1 \\
        --new-tokens 16 --fault kv_drop:5300 --policy short --out /tmp/long      # CPU, small

The policy is ``--policy`` (default ``bench/kdtree_bench/models/parity_policy.yaml``) with ``min_prompts``
set to the corpus's size, ``min_context_tokens`` to the longest bucket, ``max_new_tokens`` to
``--new-tokens`` and no speed rule (the servers share one GPU).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import yaml

from kdtree_bench.e2e.parity_resolution import (
    CHAIN_FLOOR,
    SGLangServers,
    engine_server,
    failed_rules,
    judge,
    kv_splits_floor,
    one_after_another,
)
from kdtree_bench.e2e.sglang_servers import sigint_interrupts
from kdtree_inference.faults import ENV_VAR, parse_fault
from kdtree_parity.corpus import load_corpus
from kdtree_parity.long_corpus import long_corpus_jsonl, tokenizer_encoder
from kdtree_parity.policy import load_policy, parse_policy

DEFAULT_POLICY = Path(__file__).resolve().parents[1] / "models" / "parity_policy.yaml"
SHORT_PROMPTS = 8  # the short corpus's first prompts come first: the short bucket


def write_inputs(
    raw: Path, buckets: list[int], per_bucket: int, policy: str, new_tokens: int, encode
) -> tuple[Path, Path]:
    base = raw / "base.jsonl"
    base.write_text(
        "\n".join(load_corpus("short").raw.decode().splitlines()[:SHORT_PROMPTS]) + "\n"
    )
    corpus = raw / "long.jsonl"
    corpus.write_bytes(long_corpus_jsonl(buckets, per_bucket, encode=encode, base=base))
    data = yaml.safe_load(load_policy(policy).text) or {}
    data.setdefault("replay", {})["max_new_tokens"] = new_tokens
    gate = data.setdefault("gate", {})
    gate |= {"min_prompts": len(load_corpus(corpus)), "min_context_tokens": max(buckets)}
    gate["max_slowdown"] = None
    text = yaml.safe_dump(data, sort_keys=False)
    parse_policy(text)
    path = raw / "policy.yaml"
    path.write_text(text)
    return corpus, path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--servers", choices=("engine", "sglang"), default="engine")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/models/rank"))
    p.add_argument("--preset", default="rank", help="sglang: make_model.py preset")
    p.add_argument("--buckets", default="1024,8192,32768,128000")
    p.add_argument("--per-bucket", type=int, default=3, help="prompts per bucket (depths vary)")
    p.add_argument("--fault", default="kv_drop:20000", help="the faulty candidate's fault")
    p.add_argument(
        "--new-tokens",
        type=int,
        default=32,
        help="per prompt: enough positions for a bucket's drift test to be significant",
    )
    p.add_argument("--policy", default=str(DEFAULT_POLICY))
    p.add_argument(
        "--mem-fraction",
        type=float,
        help="sglang: each server's --mem-fraction-static (default: the preset's, 0.16 for "
        "kimi-rank, else 0.08)",
    )
    args = p.parse_args(argv)
    if args.mem_fraction is not None and not 0 < args.mem_fraction < 1:
        p.error(f"--mem-fraction must be between 0 and 1, got {args.mem_fraction}")
    buckets = [int(b) for b in args.buckets.split(",") if b.strip()]
    parse_fault(args.fault)
    raw = args.out / "raw"
    for sub in ("servers", "gate", "runs"):  # where parity_resolution's judge writes
        (raw / sub).mkdir(parents=True, exist_ok=True)
    if args.servers == "sglang":
        # The servers start together (SGLang's imports and graphs are most of a start).
        servers = SGLangServers(args.model_dir, args.preset, mem_fraction=args.mem_fraction)
        start_servers, floor, options = servers.together, CHAIN_FLOOR, {}
        # SGLang's model directory holds its tokenizer once the model is written.
        encode = tokenizer_encoder(str(args.model_dir))
    else:
        start_servers = functools.partial(one_after_another, engine_server)
        floor, encode = kv_splits_floor(2), None
        # The reference engine's positions reach past the longest bucket.
        options = {"context_length": max(buckets) + 2 * args.new_tokens + 64}
        options["max_prompt_tokens"] = max(buckets) + 8
    stock = {"KDTREE_VERIFY": "off", ENV_VAR: ""}
    candidates = {
        "on": {"KDTREE_VERIFY": "on", ENV_VAR: ""},
        args.fault.replace(":", "_"): {"KDTREE_VERIFY": "on", ENV_VAR: args.fault},
    }
    wanted = [("baseline", stock, options or None), ("floor", stock, options | floor.options)]
    wanted += [(name, env, options or None) for name, env in candidates.items()]
    table: dict = {"servers": args.servers, "preset": args.preset, "buckets": buckets}
    table |= {"fault": args.fault, "floor": floor.label, "candidates": {}}
    corpus, policy = write_inputs(
        raw, buckets, args.per_bucket, args.policy, args.new_tokens, encode
    )
    started = time.monotonic()
    with start_servers(raw, wanted) as urls:
        for name in candidates:
            code, report = judge(
                urls["baseline"], urls[name], corpus, policy, raw, name, urls["floor"]
            )
            context = report.get("context") or {}
            table["candidates"][name] = {
                "exit": code,
                "verdict": (report.get("verdict") or {}).get("status"),
                "failed_rules": failed_rules(report),
                "longest_prompt_tokens": context.get("longest_prompt_tokens"),
                "buckets": {
                    b["label"]: {
                        "status": b["status"],
                        "prompts": b["prompts"],
                        "tokens": [b["min_tokens"], b["max_tokens"]],
                        "exact": b["candidate"]["exact"],
                        "hard": b["candidate"]["hard"],
                        "drift_p99": b["candidate"]["drift"]["p99"],
                        "accept_length": {a["role"]: a["mean"] for a in b["accept_length"]},
                    }
                    for b in context.get("buckets", [])
                },
            }
            table["elapsed_s"] = round(time.monotonic() - started, 1)
            (args.out / "long.json").write_text(json.dumps(table, indent=2) + "\n")
            print(
                f"{name}: {table['candidates'][name]['verdict']} (exit {code}) "
                f"{table['candidates'][name]['failed_rules']}",
                flush=True,
            )
    (args.out / "long.md").write_text(markdown(table))
    print(f"wrote {args.out / 'long.md'} and {args.out / 'long.json'}")
    return 0


def markdown(table: dict) -> str:
    lines = [
        f"# Long-context parity: {table['servers']} ({table['preset']}), buckets "
        f"{', '.join(map(str, table['buckets']))}, floor: {table['floor']}",
        "",
        "| candidate | verdict | failing rules | bucket: status (exact, hard, p99 drift) |",
        "|---|---|---|---|",
    ]
    for name, cand in table["candidates"].items():
        buckets = "; ".join(
            f"{label}: {b['status']} ({b['exact']}/{b['prompts']}, {b['hard']}, "
            f"{b['drift_p99']:.3g})"
            for label, b in cand["buckets"].items()
        )
        lines.append(
            f"| {name} | {cand['verdict']} | {', '.join(cand['failed_rules']) or '-'} | {buckets} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sigint_interrupts()
    sys.exit(main())
