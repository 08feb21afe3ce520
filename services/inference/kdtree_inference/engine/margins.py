"""``python -m kdtree_inference.engine.margins``: the greedy top-1 / top-2 margin distribution.

The seeded weights are scaled so greedy choices are rarely near-ties; this prints the evidence:
the logit gap between the chosen token and the runner-up at every generated position of a
corpus (logprob differences equal logit differences).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from ..exit_codes import ExitCode
from .config import EngineConfig, ModelConfig
from .corpus import prompts
from .scheduler import Engine

NEAR_TIE = 0.01  # below this gap float rounding differences between kernels can flip argmax


def greedy_margins(engine: Engine, texts: list[str], max_new_tokens: int) -> list[float]:
    results = engine.generate_greedy(texts, max_new_tokens, top_logprobs_num=2)
    return [top[0][0] - top[1][0] for r in results for top in r.output_top_logprobs]


def summarize(gaps: list[float]) -> dict:
    ordered = sorted(gaps)
    quantile = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "positions": len(gaps),
        "median": statistics.median(gaps),
        "p01": quantile(0.01),
        "p05": quantile(0.05),
        "p25": quantile(0.25),
        "p75": quantile(0.75),
        "fraction_below_0.01": sum(g < NEAR_TIE for g in gaps) / len(gaps),
        "fraction_below_0.1": sum(g < 0.1 for g in gaps) / len(gaps),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0, help="weight seed")
    args = p.parse_args(argv)
    engine = Engine(EngineConfig(model=ModelConfig(seed=args.seed)))
    engine.start()
    try:
        engine.wait_ready()
        summary = summarize(greedy_margins(engine, prompts(args.prompts), args.max_new_tokens))
    finally:
        engine.stop()
    print(json.dumps(summary, indent=2))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
