"""Build the backend and SGLang-shaped verify batches without a GPU or a model, for tests.

SGLang's real classes are used wherever they construct on a CPU: ``MLATokenToKVPool`` (the KV
pool), ``KVIndexTranslator`` and ``KVLocPlan`` (what the Triton backend's metadata code reads
``kv_indices`` through), ``RadixAttention`` (the layer), ``ForwardMode`` and ``ForwardMetadata``.
The model runner is SGLang's own test-kit ``MockMLAModelRunner`` (a ``ModelRunner`` subclass
with a tiny MLA config whose server args it publishes with SGLang's ``override_server_args``), so
both backends are built by their real ``__init__``. Two things are small stand-ins: the forward
batch and the speculative info (plain namespaces carrying exactly the attributes the backend
reads).

Everything runs SGLang's own metadata code (``init_forward_metadata``, the CUDA-graph path
``init_cuda_graph_state`` / ``init_forward_metadata_out_graph``) and its Triton kernels (under
TRITON_INTERPRET=1 on CPU, float32).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kdtree_verify import QK_DIM, V_DIM
from kdtree_verify.testing import chain_parents, random_tree_parents, tree_visibility


@contextlib.contextmanager
def sglang_cpu_context() -> Iterator[None]:
    """The parallel facts SGLang's attention code reads on one device without DCP."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_dcp_rank=0, dcp_enabled=False):
        yield


def make_model_runner(
    *,
    num_heads: int,
    num_draft: int,
    num_layers: int = 2,
    max_batch: int = 4,
    max_context: int = 96,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    is_draft_worker: bool = False,
    seed: int = 0,
    kv_dtype: torch.dtype | None = None,
) -> Any:
    """SGLang's own test-kit MLA model runner (``MockMLAModelRunner``: a ``ModelRunner`` with a
    tiny MLA config and its server args published through ``override_server_args``), set up
    for target verify with ``num_draft`` tokens, with an MLA KV pool of ``num_layers`` layers
    filled with random KV (in ``kv_dtype``, default ``dtype``: float8_e4m3fn is SGLang's
    ``--kv-cache-dtype fp8_e4m3``)."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods.mla_attention import (
        MLAAttentionCase,
        MockMLAModelRunner,
        TinyMLAModelConfig,
    )

    case = MLAAttentionCase(
        name="kdtree-target-verify",
        backend="triton",
        forward_mode=ForwardMode.TARGET_VERIFY,
        num_heads=num_heads,
        page_size=1,
        prefix_lens=(0,) * max_batch,
        extend_lens=(num_draft,) * max_batch,
    )
    config = TinyMLAModelConfig(
        num_heads=num_heads,
        kv_lora_rank=V_DIM,
        qk_rope_head_dim=QK_DIM - V_DIM,
        hidden_size=64,
        context_len=max_context,
    )
    runner = MockMLAModelRunner(
        case=case,
        model_config=config,
        dtype=dtype,
        device=device,
        max_context_len=max_context,
        kv_lora_rank=V_DIM,
        qk_rope_head_dim=QK_DIM - V_DIM,
        runner_batch_size=max_batch,
    )
    # The mock publishes its server args on construction; they are re-published around each
    # backend construction (make_backend) and withdrawn otherwise, so no other test sees them.
    runner._server_args_override.restore()
    runner.token_to_kv_pool = MLATokenToKVPool(
        size=runner.token_to_kv_pool.size,
        page_size=1,
        dtype=kv_dtype or dtype,
        kv_lora_rank=V_DIM,
        qk_rope_head_dim=QK_DIM - V_DIM,
        layer_num=num_layers,
        device=device,
        enable_memory_saver=False,
    )
    runner.is_draft_worker = is_draft_worker
    runner.init_kv_index_translator()
    generator = torch.Generator().manual_seed(seed)
    for layer_id in range(num_layers):
        buffer = runner.token_to_kv_pool.get_key_buffer(layer_id)
        buffer.copy_(torch.randn(buffer.shape, generator=generator).to(buffer.dtype))
    return runner


def make_backend(cls: type, runner: Any, **kdtree_kwargs: Any) -> Any:
    """``cls(runner)`` (TritonAttnBackend or our subclass) through its real ``__init__``, with the
    runner's server args published for the duration. ``kdtree_kwargs``: ``kdtree_settings``,
    ``kdtree_registry`` for our subclass."""
    with runner._server_args_override, sglang_cpu_context():
        return cls(runner, **kdtree_kwargs)


def make_layer(layer_id: int, num_heads: int, scaling: float = 0.1352, **overrides: Any) -> Any:
    """SGLang's real ``RadixAttention`` configured as DeepSeek's absorbed MLA ``attn_mqa``."""
    from sglang.srt.layers.radix_attention import RadixAttention

    layer = RadixAttention(
        num_heads, QK_DIM, scaling, num_kv_heads=1, layer_id=layer_id, v_head_dim=V_DIM
    )
    for name, value in overrides.items():
        setattr(layer, name, value)
    return layer


@dataclass
class VerifyBatch:
    """One target-verify step: the forward batch and, per layer, the q/k/v SGLang would pass."""

    forward_batch: SimpleNamespace
    prefix_lens: list[int]
    num_draft: int
    qkv: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def make_verify_batch(
    runner: SimpleNamespace,
    prefix_lens: Sequence[int],
    num_draft: int,
    num_heads: int,
    layer_ids: Sequence[int],
    *,
    mask: str = "tree",
    request_rows: Sequence[int] | None = None,
    seed: int = 1,
    forward: str = "target_verify",
    dtype: torch.dtype | None = None,
) -> VerifyBatch:
    """Place the requests' tokens on fragmented pool slots and build the verify forward batch.

    ``mask``: "tree" (random draft trees), "chain" or "causal" (``custom_mask=None``, DFlash).
    ``forward``: "target_verify", or "draft_extend" for EAGLE's draft-extend forward
    (``DRAFT_EXTEND_V2``: the same tokens as an extend batch, causal, as SGLang's EAGLE worker
    builds it: extend lengths of ``num_draft`` over the committed prefixes).
    ``dtype``: of q/k/v (default the pool's; give it for an fp8 pool).
    """
    if forward not in ("target_verify", "draft_extend"):
        raise ValueError(f"forward: target_verify or draft_extend, got {forward!r}")
    if forward == "draft_extend":
        mask = "causal"
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    generator = torch.Generator().manual_seed(seed)
    device = runner.device
    pool = runner.token_to_kv_pool
    batch = len(prefix_lens)
    rows = list(request_rows) if request_rows is not None else list(range(batch))
    needed = sum(prefix_lens) + batch * num_draft
    slots = torch.randperm(pool.size, generator=generator)[:needed] + 1  # slot 0 is padding
    req_to_token = runner.req_to_token_pool.req_to_token
    draft_slots, start = [], 0
    for row, prefix in zip(rows, prefix_lens, strict=True):
        length = prefix + num_draft
        req_to_token[row, :length] = slots[start : start + length].to(req_to_token.dtype)
        draft_slots.append(slots[start + prefix : start + length])
        start += length
    out_cache_loc = torch.cat(draft_slots).to(device=device, dtype=torch.int64)

    masks = []
    if mask != "causal":
        for prefix in prefix_lens:
            parents = (
                chain_parents(num_draft)
                if mask == "chain"
                else random_tree_parents(num_draft, generator)
            )
            block = torch.ones(num_draft, prefix + num_draft, dtype=torch.bool)
            block[:, prefix:] = tree_visibility(parents)
            masks.append(block.flatten())
    custom_mask = torch.cat(masks).to(device) if masks else None

    req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=device)
    prefix_tensor = torch.tensor(list(prefix_lens), dtype=torch.int64, device=device)
    # Target verify counts the committed prefix; a draft extend the length after its write.
    seq_lens = prefix_tensor if forward == "target_verify" else prefix_tensor + num_draft
    plan = KVLocPlan(
        source=runner.kv_index_translator,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(),
        write_virtual=out_cache_loc,
    )
    forward_batch = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=batch,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
        kv_loc_plan=plan,
        spec_info=SimpleNamespace(custom_mask=custom_mask, num_tokens_per_req=num_draft),
        out_cache_loc=out_cache_loc,
        out_cache_loc_is_physical=False,
        encoder_lens=None,
        mha_one_shot=False,
        attn_attend_prefix_cache=False,
        extend_seq_lens_cpu=None,
        extend_seq_lens=None,  # target verify leaves the extend fields unset
        extend_start_loc=None,
        extend_prefix_lens=None,
    )
    if forward == "draft_extend":
        extend_lens = torch.full((batch,), num_draft, dtype=torch.int64, device=device)
        forward_batch.forward_mode = ForwardMode.DRAFT_EXTEND_V2
        forward_batch.extend_seq_lens = extend_lens
        forward_batch.extend_seq_lens_cpu = [num_draft] * batch
        forward_batch.extend_prefix_lens = prefix_tensor
        forward_batch.extend_prefix_lens_cpu = list(prefix_lens)
        forward_batch.extend_start_loc = torch.cumsum(extend_lens, 0) - extend_lens
        forward_batch.spec_info.extend_seq_lens_tensor = extend_lens  # read by graph metadata
    dtype = dtype or pool.dtype
    total = batch * num_draft
    qkv = {}
    for layer_id in layer_ids:
        q = torch.randn(total, num_heads * QK_DIM, generator=generator).to(device, dtype)
        k = torch.randn(total, 1, QK_DIM, generator=generator).to(device, dtype)
        qkv[layer_id] = (q, k, k[..., :V_DIM])  # v is the latent part of k, as in DeepSeek
    return VerifyBatch(forward_batch, list(prefix_lens), num_draft, qkv)
