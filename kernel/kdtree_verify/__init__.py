"""kdtree_verify: MLA tree-verify attention for speculative decoding in SGLang's layout.

- ``VerifyMetadata.build``: a forward's indptrs, indices, mask, plan and softmax scale, validated
  once and shared by every layer.
- ``verify_attention``: one layer's call on that metadata (the torch.library op
  ``kdtree::verify_attention`` underneath; CPU and CUDA).
- ``verify_attention_reference``: the plain float32 definition it is measured against.
- ``layout``: graph-safe helpers from SGLang metadata to kernel inputs.
- ``testing``: synthetic cases in SGLang's exact layout.
"""

from .dims import QK_DIM, ROPE_DIM, V_DIM
from .metadata import DEFAULT_CHUNK_SIZE, ForwardLayout, VerifyMetadata
from .op import deepseek_v3_sm_scale, merge_partials, verify_attention
from .reference import verify_attention_reference
from .validation import VerifyInputError

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "QK_DIM",
    "ROPE_DIM",
    "V_DIM",
    "ForwardLayout",
    "VerifyInputError",
    "VerifyMetadata",
    "deepseek_v3_sm_scale",
    "merge_partials",
    "verify_attention",
    "verify_attention_reference",
]
