"""Speculative greedy == plain greedy, token for token (the engine's losslessness).

Plain greedy is the same engine with a one-node draft tree (``num_draft_tokens=1``): every step
commits exactly the target's argmax. Speculative runs use trees of several shapes; requests are
submitted concurrently so several share each verify forward (ragged prefixes in one batch).
"""

from __future__ import annotations

import pytest

from kdtree_inference.engine.config import EngineConfig, SpecConfig
from kdtree_inference.engine.corpus import prompts
from kdtree_inference.engine.scheduler import Engine

TREE_SHAPES = {
    "chain4": SpecConfig(num_draft_tokens=4, topk=1, max_depth=3),
    "tree8x2": SpecConfig(num_draft_tokens=8, topk=2, max_depth=6),
    "wide16x4": SpecConfig(num_draft_tokens=16, topk=4, max_depth=4),
}
PROMPTS = prompts(6)
MAX_NEW = 32


def _run(attention: str, spec: SpecConfig, batch: int) -> tuple[list[list[int]], int]:
    engine = Engine(EngineConfig(attention=attention, spec=spec, max_batch_size=batch))
    engine.start()
    try:
        engine.wait_ready()
        results = engine.generate_greedy(PROMPTS, MAX_NEW, timeout=300)
    finally:
        engine.stop()
    accepted = sum(r.spec_num_correct_drafts for r in results)
    return [r.output_ids for r in results], accepted


@pytest.fixture(scope="module")
def plain_greedy() -> list[list[int]]:
    outputs, accepted = _run("reference", SpecConfig(num_draft_tokens=1), batch=1)
    assert accepted == 0
    assert all(len(o) == MAX_NEW for o in outputs)
    return outputs


@pytest.mark.parametrize("attention", ["reference", "op"])
@pytest.mark.parametrize("shape", sorted(TREE_SHAPES))
@pytest.mark.parametrize("batch", [1, 4])
def test_speculative_greedy_equals_plain_greedy(
    plain_greedy: list[list[int]], attention: str, shape: str, batch: int
) -> None:
    outputs, accepted = _run(attention, TREE_SHAPES[shape], batch)
    for prompt, want, got in zip(PROMPTS, plain_greedy, outputs, strict=True):
        assert got == want, f"{attention}/{shape}/batch {batch} diverged on {prompt!r}"
    # Guard against a vacuous pass: drafts must actually have been accepted along the way.
    assert accepted > 0


def test_plain_greedy_with_op_equals_reference(plain_greedy: list[list[int]]) -> None:
    outputs, _ = _run("op", SpecConfig(num_draft_tokens=1), batch=8)
    assert outputs == plain_greedy


def test_triton_backend_under_interpreter_is_lossless() -> None:
    """SGLang's own extend_attention_fwd (Triton interpreter on CPU, float32) as the verify kernel.

    A 1-layer, 4-head variant keeps the interpreter's cost down; both sides use the same model.
    """
    from kdtree_inference.engine.config import ModelConfig

    model = ModelConfig(num_layers=1, num_heads=4)
    texts = ["1 2 1 2 1 2", "xyzxyzxyz"]

    def run(attention: str, spec: SpecConfig) -> list:
        engine = Engine(EngineConfig(attention=attention, model=model, spec=spec, max_batch_size=2))
        engine.start()
        try:
            engine.wait_ready()
            return engine.generate_greedy(texts, 12, timeout=600)
        finally:
            engine.stop()

    plain = run("reference", SpecConfig(num_draft_tokens=1))
    triton = run("triton", SpecConfig(num_draft_tokens=4, topk=2, max_depth=3))
    assert [r.output_ids for r in triton] == [r.output_ids for r in plain]
    assert sum(r.spec_num_correct_drafts for r in triton) > 0


def test_validate_mode_serves_the_baseline_and_records_the_difference(
    plain_greedy: list[list[int]],
) -> None:
    engine = Engine(EngineConfig(attention="validate", spec=TREE_SHAPES["tree8x2"]))
    engine.start()
    try:
        engine.wait_ready()
        outputs = [r.output_ids for r in engine.generate_greedy(PROMPTS, MAX_NEW, timeout=300)]
        backend = engine.model.attention
        assert outputs == plain_greedy
        assert backend.validate_calls > 0
        # op's CPU implementation vs the float32 reference: equal to float32 rounding.
        assert 0.0 <= backend.validate_max_abs_diff < 1e-4
    finally:
        engine.stop()
