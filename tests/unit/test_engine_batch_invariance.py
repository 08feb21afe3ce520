"""The engine's numerics do not depend on batch-mates: a request's logprobs are bit-identical
whether it is decoded alone or in a verify forward shared with other requests."""

from __future__ import annotations

import pytest

from kdtree_inference.engine.config import EngineConfig
from kdtree_inference.engine.corpus import prompts
from kdtree_inference.engine.scheduler import Engine, GenerationResult

TEXTS = prompts(6)


def _logprobs(results: list[GenerationResult]) -> list[list[tuple]]:
    return [
        [*r.output_token_logprobs, *(tuple(top) for top in r.output_top_logprobs)] for r in results
    ]


@pytest.mark.parametrize("attention", ["reference", "op"])
def test_logprobs_are_identical_alone_and_batched(attention: str) -> None:
    engine = Engine(EngineConfig(attention=attention, kv_pool_size=8192))
    engine.start()
    try:
        engine.wait_ready()
        alone = [engine.generate_greedy([t], 12, top_logprobs_num=5)[0] for t in TEXTS]
        batched = engine.generate_greedy(TEXTS, 12, top_logprobs_num=5)
        # The same texts in another order: each request gets other neighbours and offsets.
        reordered = engine.generate_greedy(TEXTS[::-1], 12, top_logprobs_num=5)[::-1]
    finally:
        engine.stop()
    assert [r.output_ids for r in batched] == [r.output_ids for r in alone]
    assert _logprobs(batched) == _logprobs(alone)
    assert _logprobs(reordered) == _logprobs(alone)
