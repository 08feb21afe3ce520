"""kdtree_verify: MLA tree-verify attention for speculative decoding in SGLang's layout.

- ``verify_attention``: the op (torch.library ``kdtree::verify_attention``; CPU and CUDA).
- ``verify_attention_reference``: the plain float32 definition it is measured against.
- ``layout``: graph-safe helpers from SGLang metadata to kernel inputs.
- ``testing``: synthetic cases in SGLang's exact layout.
"""

from .op import DEFAULT_CHUNK_SIZE, deepseek_v3_sm_scale, merge_partials, verify_attention
from .reference import verify_attention_reference
from .validation import VerifyInputError, validate_verify_inputs

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "VerifyInputError",
    "deepseek_v3_sm_scale",
    "merge_partials",
    "validate_verify_inputs",
    "verify_attention",
    "verify_attention_reference",
]
