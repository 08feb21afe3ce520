#!/usr/bin/env python3
"""End-to-end runs of real SGLang 0.5.23 servers with the kdtree backend: decode speed, off vs on.

Each configuration is one ``kdtree-serve`` server (``bench/sglang_servers.py``) serving a model
from ``bench/models/make_model.py`` with EAGLE's draft tree and decode CUDA graphs. The
correctness checks (validate identical to off, the parity gate between real servers) are the GPU
test module ``tests/gpu/test_sglang_e2e.py``; this script measures speed and writes the records
that ``bench/results/sglang_e2e_h200.json`` collects.

How a measurement is taken, per (mode, batch, prompt length): ``batch`` distinct prompts of
``prompt_len`` random token ids go in one /generate call with ``max_new_tokens`` 1, which
prefills them into the radix cache; then the same call with ``max_new_tokens`` N and
``ignore_eos`` is timed. Its prompts hit the cache (one token is recomputed), so the time is N
tokens of decode for the whole batch at once, and SGLang's own ``spec_verify_ct`` says how many
speculative steps that took:

- ``tokens_per_s`` = generated tokens of the batch / wall time of the call;
- ``step_ms`` = wall time / the largest ``spec_verify_ct`` of the batch;
- ``accept_length`` = generated tokens / verify steps, averaged over the batch.

Configurations are measured one at a time (never two servers decoding at once), off and on
alternating per shape.

Usage (on the GPU machine, with the payload's environment; see docs/development.md):
    python bench/sglang_e2e.py --model DIR --out OUT [--batches 1,8] [--prompt-lens 1024,...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_servers import GRAPH_MAX_BS, ServerSpec, SGLangServer, start_all, stop_all

MODES = {
    # configuration: (KDTREE_VERIFY, more environment)
    "off": ("off", {}),
    "on": ("on", {}),
    # on for target verify only: what serving EAGLE's draft extend through the kernel buys.
    "on_draft_triton": ("on", {"KDTREE_DRAFT_EXTEND": "off"}),
}


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from error
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` distinct prompts of ``length`` token ids (no special tokens: ids 2 and up)."""
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(length)] for _ in range(batch)]


def metric_values(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> {sample name: [(labels, value), ...]}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return values


def metric_sum(values: dict, name: str, **labels: str) -> float:
    """Sum of a sample over the label sets that match ``labels``."""
    return sum(
        v for got, v in values.get(name, []) if all(got.get(k) == w for k, w in labels.items())
    )


def measure(
    server: SGLangServer, prompts: list[list[int]], new_tokens: int, timeout_s: float
) -> dict[str, Any]:
    """Prefill ``prompts`` into the cache, then time ``new_tokens`` of decode for all of them."""
    greedy = {"temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    server.post(
        "/generate",
        {"input_ids": prompts, "sampling_params": {**greedy, "max_new_tokens": 1}},
        timeout_s,
    )
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    answers = server.post(
        "/generate",
        {"input_ids": prompts, "sampling_params": {**greedy, "max_new_tokens": new_tokens}},
        timeout_s,
    )
    wall_s = time.perf_counter() - t0
    answers = answers if isinstance(answers, list) else [answers]
    generated = [a["meta_info"]["completion_tokens"] for a in answers]
    steps = [a["meta_info"].get("spec_verify_ct") or 0 for a in answers]
    cached = [a["meta_info"].get("cached_tokens", 0) for a in answers]
    accept = [g / s for g, s in zip(generated, steps, strict=True) if s]
    return {
        "batch": len(prompts),
        "prompt_len": len(prompts[0]),
        "new_tokens": new_tokens,
        "generated_tokens": sum(generated),
        "wall_s": round(wall_s, 4),
        "prefill_s": round(prefill_s, 3),
        "cached_tokens_min": min(cached),
        "tokens_per_s": round(sum(generated) / wall_s, 2),
        "verify_steps_max": max(steps),
        "step_ms": round(wall_s * 1e3 / max(steps), 3) if max(steps) else None,
        "accept_length": round(sum(accept) / len(accept), 3) if accept else None,
        "output_ids_head": answers[0]["output_ids"][:16],
    }


def speed_specs(
    model: Path,
    modes: list[str],
    mem_fraction: float,
    extra: tuple[str, ...],
    tp: int = 1,
    graph_max_bs: int = GRAPH_MAX_BS,
) -> list[ServerSpec]:
    return [
        ServerSpec(
            f"speed_{name}",
            MODES[name][0],
            model,
            mem_fraction=mem_fraction,
            extra=extra,
            env=MODES[name][1],
            tp=tp,
            graph_max_bs=graph_max_bs,
        )
        for name in modes
    ]


def run_speed(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((args.model / "config.json").read_text())
    specs = speed_specs(
        args.model, args.modes, args.mem_fraction, tuple(args.server_arg), tp=args.tp,
        graph_max_bs=args.graph_max_bs,
    )  # fmt: skip
    servers, failed = start_all(specs, out, args.start_timeout)
    records: list[dict[str, Any]] = []
    try:
        if failed:
            raise SystemExit(f"servers failed to start: {sorted(failed)}; logs in {out}")
        for prompt_len in args.prompt_lens:
            for batch in args.batches:
                prompts = random_prompts(
                    batch, prompt_len, config["vocab_size"], prompt_len + batch
                )
                for mode in args.modes:
                    server = servers[f"speed_{mode}"]
                    try:
                        record = measure(server, prompts, args.new_tokens, args.request_timeout)
                    except (RuntimeError, OSError) as error:
                        record = {"batch": batch, "prompt_len": prompt_len, "error": str(error)}
                    record.update(
                        model=config.get("kdtree_model", {}).get("preset", args.model.name),
                        mode=server.spec.mode,
                        configuration=mode,
                        server=server.spec.describe(),
                        server_flags=server.spec.flags(server.port),
                        log=server.log_path.name,
                    )
                    records.append(record)
                    print(f"[e2e] {json.dumps(record)}", flush=True)
        metrics = {name: s.get("/metrics") for name, s in servers.items()}
    finally:
        stop_all(servers)
    for name, text in metrics.items():
        (out / f"metrics_{name}.txt").write_text(text)
    result = {
        "model": config.get("kdtree_model"),
        "model_config": {
            k: config[k]
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "q_lora_rank",
                "kv_lora_rank",
                "n_routed_experts",
                "num_experts_per_tok",
            )
        },
        "new_tokens": args.new_tokens,
        "records": records,
        "ready_after_s": {n: s.ready_after_s for n, s in servers.items()},
    }
    (out / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory (make_model.py)")
    parser.add_argument("--out", type=Path, required=True, help="logs and speed.json go here")
    parser.add_argument("--batches", type=parse_ints, default=[1, 8])
    parser.add_argument("--prompt-lens", type=parse_ints, default=[1024, 8192, 32768])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument(
        "--modes",
        type=lambda text: [m for m in text.split(",") if m],
        default=list(MODES),
        help=f"comma-separated, from {', '.join(MODES)} (default: all)",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every server")
    parser.add_argument("--mem-fraction", type=float, default=0.12)
    parser.add_argument(
        "--graph-max-bs",
        type=int,
        default=GRAPH_MAX_BS,
        help=f"decode CUDA graphs for batches 1..N; larger ones run eagerly (default {GRAPH_MAX_BS})",
    )
    parser.add_argument("--start-timeout", type=float, default=420.0)
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument(
        "--server-arg", action="append", default=[], help="one more SGLang argument (repeatable)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (args.model / "config.json").is_file():
        print(f"sglang_e2e: no config.json in {args.model}", file=sys.stderr)
        return 2
    if args.tp < 1:
        print(f"sglang_e2e: --tp must be at least 1, got {args.tp}", file=sys.stderr)
        return 2
    if args.graph_max_bs < 1:
        print(f"sglang_e2e: --graph-max-bs must be at least 1, got {args.graph_max_bs}",
              file=sys.stderr)  # fmt: skip
        return 2
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown or not args.modes:
        print(f"sglang_e2e: --modes: unknown {unknown}; choose from {list(MODES)}", file=sys.stderr)
        return 2
    run_speed(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
