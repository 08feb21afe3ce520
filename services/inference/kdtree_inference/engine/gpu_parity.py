"""``python -m kdtree_inference.engine.gpu_parity``: op (our CUDA kernel) vs triton (SGLang's kernel).

End-to-end parity on the GPU machine: the same seeded model decodes the same corpus greedily with
tree speculative decoding twice, once with each verify kernel, and the script records how many
prompts differ and where (first differing token, each side's top-1/top-2 margin there, so a
near-tie can be told from a real error). It also checks losslessness on the GPU: op speculative vs
op plain greedy (one-node trees). Needs only torch, kdtree_verify and SGLang's kernel modules.

    python -m kdtree_inference.engine.gpu_parity --prompts 100 \
        --out bench/results/engine_gpu_parity.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from ..exit_codes import ExitCode
from .config import EngineConfig, ModelConfig, SpecConfig
from .corpus import prompts
from .scheduler import Engine, GenerationResult

NEAR_TIE = 0.1  # bf16 logit noise: top-1/top-2 gaps below this may legitimately flip


def run_corpus(config: EngineConfig, texts: list[str], max_new_tokens: int) -> tuple[list, float]:
    engine = Engine(config)
    engine.start()
    try:
        engine.wait_ready(timeout=600)
        start = time.perf_counter()
        results = engine.generate_greedy(texts, max_new_tokens, top_logprobs_num=2, timeout=1800)
        return results, time.perf_counter() - start
    finally:
        engine.stop()


def _margin(result: GenerationResult, position: int) -> float | None:
    if position >= len(result.output_top_logprobs):
        return None
    top = result.output_top_logprobs[position]
    return top[0][0] - top[1][0]


def diff_runs(
    texts: list[str], left: list[GenerationResult], right: list[GenerationResult]
) -> list[dict]:
    """One record per prompt whose output ids differ."""
    out = []
    for i, (text, a, b) in enumerate(zip(texts, left, right, strict=True)):
        if a.output_ids == b.output_ids:
            continue
        pos = next(
            (j for j, (x, y) in enumerate(zip(a.output_ids, b.output_ids, strict=False)) if x != y),
            min(len(a.output_ids), len(b.output_ids)),
        )
        margins = [_margin(a, pos), _margin(b, pos)]
        known = [m for m in margins if m is not None]
        out.append(
            {
                "prompt_index": i,
                "prompt": text,
                "first_divergence": pos,
                "left_token": a.output_ids[pos] if pos < len(a.output_ids) else None,
                "right_token": b.output_ids[pos] if pos < len(b.output_ids) else None,
                "left_margin": margins[0],
                "right_margin": margins[1],
                "class": "near-tie" if known and min(known) < NEAR_TIE else "hard",
            }
        )
    return out


def _accept(results: list[GenerationResult]) -> dict:
    steps = sum(r.spec_verify_ct for r in results)
    tokens = sum(len(r.output_ids) for r in results)
    return {
        "verify_steps": steps,
        "output_tokens": tokens,
        "accept_length": tokens / steps if steps else None,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="op vs triton greedy parity of the reference engine")
    p.add_argument("--prompts", type=int, default=100)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-draft-tokens", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="requests decoded together")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/engine_gpu_parity.json")
    return p


def _run_engines(
    args: argparse.Namespace, texts: list[str], spec: SpecConfig
) -> dict[str, tuple[list[GenerationResult], float]]:
    """The corpus through triton, op (both speculative) and op plain greedy: (results, seconds)."""

    def config(attention: str, spec_config: SpecConfig) -> EngineConfig:
        return EngineConfig(
            model=ModelConfig(seed=args.seed),
            spec=spec_config,
            attention=attention,
            device=args.device,
            dtype=args.dtype,
            max_batch_size=args.batch,
        )

    runs = {}
    for name, attention, spec_config in (
        ("triton", "triton", spec),
        ("op", "op", spec),
        ("op_plain", "op", SpecConfig(num_draft_tokens=1)),
    ):
        print(f"running {name} over {len(texts)} prompts ...", flush=True)
        runs[name] = run_corpus(config(attention, spec_config), texts, args.max_new_tokens)
        print(f"  {runs[name][1]:.1f}s", flush=True)
    return runs


def _report(
    args: argparse.Namespace,
    texts: list[str],
    spec: SpecConfig,
    runs: dict[str, tuple[list[GenerationResult], float]],
) -> dict:
    op_vs_triton = diff_runs(texts, runs["op"][0], runs["triton"][0])
    spec_vs_plain = diff_runs(texts, runs["op"][0], runs["op_plain"][0])
    return {
        "what": "reference engine greedy outputs: op (kdtree verify kernel) vs triton "
        "(SGLang extend_attention_fwd); left = op, right = triton / op plain greedy; "
        f"a divergence is a near-tie when either side's top-1/top-2 gap there is < {NEAR_TIE}",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "prompts": len(texts),
        "max_new_tokens": args.max_new_tokens,
        "speculative": {
            "num_draft_tokens": spec.num_draft_tokens,
            "topk": spec.topk,
            "max_depth": spec.max_depth,
            "batch": args.batch,
        },
        "op_vs_triton": {
            "differing_prompts": len(op_vs_triton),
            "near_tie_divergences": sum(d["class"] == "near-tie" for d in op_vs_triton),
            "hard_divergences": sum(d["class"] == "hard" for d in op_vs_triton),
            "differences": op_vs_triton,
        },
        "op_speculative_vs_plain": {
            "differing_prompts": len(spec_vs_plain),
            "hard_divergences": sum(d["class"] == "hard" for d in spec_vs_plain),
            "differences": spec_vs_plain,
        },
        "seconds": {name: run[1] for name, run in runs.items()},
        "acceptance": {name: _accept(run[0]) for name, run in runs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_parity: no CUDA device; this script is for the GPU machine", file=sys.stderr)
        return ExitCode.REFUSED
    if args.prompts < 1:
        p.error("--prompts must be >= 1")
    texts = prompts(args.prompts)
    spec = SpecConfig(num_draft_tokens=args.num_draft_tokens, topk=args.topk)
    report = _report(args, texts, spec, _run_engines(args, texts, spec))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("device", "dtype", "prompts")}))
    print(
        f"op vs triton: {report['op_vs_triton']['differing_prompts']}/{len(texts)} prompts differ "
        f"({report['op_vs_triton']['hard_divergences']} hard); "
        f"op speculative vs plain: {report['op_speculative_vs_plain']['differing_prompts']} differ; "
        f"written to {out}"
    )
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
