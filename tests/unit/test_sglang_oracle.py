"""The reference and the CPU op against SGLang 0.5.23's own ``extend_attention_fwd``.

SGLang's Triton kernel runs here in Triton's interpreter (TRITON_INTERPRET=1, set by
tests/conftest.py on machines without CUDA) in float32: this is the real code SGLang runs on
target verify, so agreement here ties our definition of the op to SGLang's.
"""

import random

import pytest
import torch

from kdtree_verify import verify_attention, verify_attention_reference
from kdtree_verify.testing import make_case, sglang_extend_attention

if torch.cuda.is_available():
    pytest.skip(
        "the CPU oracle runs on machines without CUDA (tests/gpu covers CUDA)",
        allow_module_level=True,
    )

HEADS = [1, 8, 12, 16]
MASKS = ["tree", "chain", "causal"]


def generated_cases(count: int = 33, seed: int = 2026) -> list[dict]:
    """Deterministic spread over every axis the issue names; every value of each axis appears."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        batch = rng.choice([1, 2, 3])
        prefix_lens = [rng.choice([0, 1, rng.randint(2, 90)]) for _ in range(batch)]
        if i % 4 == 0:
            prefix_lens[0] = 0  # prefix 0 in a ragged batch, regularly
        cases.append(
            dict(
                prefix_lens=prefix_lens,
                num_draft=(i % 16) + 1,  # T = 1..16
                num_heads=HEADS[i % len(HEADS)],
                mask=MASKS[i % len(MASKS)],
                mask_dtype=torch.uint8 if i % 2 else torch.bool,
                index_dtype=torch.int64 if i % 5 else torch.int32,
                strided_v=i % 3 != 2,
                seed=i,
            )
        )
    return cases


CASES = generated_cases()


def _case_id(spec: dict) -> str:
    return (
        f"p{'_'.join(map(str, spec['prefix_lens']))}-T{spec['num_draft']}-H{spec['num_heads']}"
        f"-{spec['mask']}-{str(spec['mask_dtype']).split('.')[-1]}-{str(spec['index_dtype']).split('.')[-1]}"
        f"-{'strided' if spec['strided_v'] else 'separate'}V"
    )


def test_the_generated_sweep_covers_every_axis():
    assert len(CASES) >= 30
    assert {c["num_heads"] for c in CASES} == set(HEADS)
    assert {c["num_draft"] for c in CASES} == set(range(1, 17))
    assert {c["mask"] for c in CASES} == set(MASKS)
    assert {c["mask_dtype"] for c in CASES} == {torch.bool, torch.uint8}
    assert {c["index_dtype"] for c in CASES} == {torch.int32, torch.int64}
    assert {c["strided_v"] for c in CASES} == {True, False}
    assert any(0 in c["prefix_lens"] and len(set(c["prefix_lens"])) > 1 for c in CASES)


@pytest.mark.parametrize("spec", CASES, ids=_case_id)
def test_reference_and_cpu_op_match_sglang_extend_attention(spec):
    case = make_case(**spec)
    expected = sglang_extend_attention(*case.args())
    reference = verify_attention_reference(*case.args())
    torch.testing.assert_close(reference, expected, atol=2e-5, rtol=2e-5)
    for chunk_size in (1, 16, 64):  # many partials, a few, one: the merge must not care
        op_out = verify_attention(*case.args(chunk_size=chunk_size))
        torch.testing.assert_close(op_out, expected, atol=2e-5, rtol=2e-5)
