"""Build the backend and SGLang-shaped verify batches without a GPU or a model, for tests.

SGLang's real classes are used wherever they construct on a CPU: ``MLATokenToKVPool`` (the KV
pool), ``KVIndexTranslator`` and ``KVLocPlan`` (what the Triton backend's metadata code reads
``kv_indices`` through), ``RadixAttention`` (the layer), ``ForwardMode`` and ``ForwardMetadata``.
Three things are small stand-ins: the model runner, the forward batch and the speculative info
(plain namespaces carrying exactly the attributes the backend reads). ``TritonAttnBackend.__init__``
needs SGLang's full runtime context (server args, spec config, device queries), so the backend
is made with ``object.__new__`` and given the attributes that constructor would set for an MLA
model on one GPU; ``KdtreeTritonAttnBackend._init_kdtree`` then runs as its ``__init__`` would.

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

from kdtree_verify.testing import chain_parents, random_tree_parents, tree_visibility

QK_DIM, V_DIM = 576, 512


@contextlib.contextmanager
def sglang_cpu_context() -> Iterator[None]:
    """The one piece of SGLang's runtime context the verify path reads (no DCP)."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(dcp_enabled=False):
        yield


def make_model_runner(
    *,
    num_layers: int = 2,
    pool_size: int = 256,
    max_batch: int = 4,
    max_context: int = 96,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    page_size: int = 1,
    is_draft_worker: bool = False,
    seed: int = 0,
) -> SimpleNamespace:
    """A model-runner stand-in holding SGLang's real MLA KV pool, filled with random KV."""
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    pool = MLATokenToKVPool(
        size=pool_size,
        page_size=page_size,
        dtype=dtype,
        kv_lora_rank=V_DIM,
        qk_rope_head_dim=QK_DIM - V_DIM,
        layer_num=num_layers,
        device=device,
        enable_memory_saver=False,
    )
    generator = torch.Generator().manual_seed(seed)
    for layer_id in range(num_layers):
        buffer = pool.get_key_buffer(layer_id)
        buffer.copy_(torch.randn(buffer.shape, generator=generator).to(buffer.dtype))
    req_to_token = torch.zeros(max_batch, max_context, dtype=torch.int32, device=device)
    translator = KVIndexTranslator(
        req_to_token=req_to_token,
        token_to_kv_pool_allocator=None,
        token_to_kv_pool=pool,
        page_size=page_size,
        device=device,
    )
    return SimpleNamespace(
        token_to_kv_pool=pool,
        req_to_token_pool=SimpleNamespace(size=max_batch, req_to_token=req_to_token),
        kv_index_translator=translator,
        device=device,
        page_size=page_size,
        is_draft_worker=is_draft_worker,
        tp_rank=0,
        max_context=max_context,
        generator=generator,
    )


def make_backend(
    cls: type, runner: SimpleNamespace, num_draft: int, num_heads: int, **kdtree_kwargs: Any
) -> Any:
    """``cls`` (TritonAttnBackend or our subclass) with the state its ``__init__`` would give an
    MLA model on one device: no sliding window, no DCP, no deterministic mode, page size from
    the runner. ``kdtree_kwargs`` go to ``_init_kdtree`` (settings, registry)."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    backend = object.__new__(cls)
    pool = runner.token_to_kv_pool
    max_batch = runner.req_to_token_pool.size
    backend.__dict__.update(
        # kernels (the parent wraps them in torch.compiler.disable)
        extend_attention_fwd=extend_attention_fwd,
        # model / pool facts
        device=runner.device,
        token_to_kv_pool=pool,
        req_to_token_pool=runner.req_to_token_pool,
        req_to_token=runner.req_to_token_pool.req_to_token,
        kv_index_translator=runner.kv_index_translator,
        page_size=runner.page_size,
        use_mla=True,
        max_context_len=runner.max_context,
        num_head=num_heads,
        v_head_dim=V_DIM,
        swa_v_head_dim=None,
        # speculative decoding
        num_draft_tokens=num_draft,
        target_verify_num_tokens_per_req=num_draft,
        is_draft_runner=runner.is_draft_worker,
        skip_prefill=False,
        # features this configuration has off
        sliding_window_size=None,
        window_kv_indptr=None,
        use_sliding_window_kv_pool=False,
        dllm_attention=None,
        dcp_size=1,
        enable_deterministic=False,
        use_dense_fp8_chunked_prefill=False,
        use_verify_shared_kv=False,
        use_verify_splitkv=False,
        allow_bidirectional_attention_in_extend=False,
        _dense_one_shot_kv_indptr=None,
        # decode-graph buffers init_cuda_graph_state sizes
        max_kv_splits=2,
        lean_total_programs=1,
        lean_block_m=16,
        # metadata buffers the parent's __init__ allocates
        kv_indptr=torch.zeros(max_batch + 1, dtype=torch.int32, device=runner.device),
        qo_indptr=torch.zeros(max_batch + 1, dtype=torch.int64, device=runner.device),
        mask_indptr=torch.zeros(max_batch + 1, dtype=torch.int64, device=runner.device),
        forward_metadata=None,
        _verify_mask=None,
    )
    if hasattr(backend, "_init_kdtree"):
        backend._init_kdtree(runner, **kdtree_kwargs)
    return backend


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
) -> VerifyBatch:
    """Place the requests' tokens on fragmented pool slots and build the verify forward batch.

    ``mask``: "tree" (random draft trees), "chain" or "causal" (``custom_mask=None``, DFlash).
    """
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
    seq_lens = torch.tensor(list(prefix_lens), dtype=torch.int64, device=device)
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
        seq_lens_sum=int(sum(prefix_lens)),
        kv_loc_plan=plan,
        spec_info=SimpleNamespace(custom_mask=custom_mask, num_tokens_per_req=num_draft),
        out_cache_loc=out_cache_loc,
        out_cache_loc_is_physical=False,
        encoder_lens=None,
        mha_one_shot=False,
        attn_attend_prefix_cache=False,
        extend_seq_lens_cpu=None,
    )
    dtype = pool.dtype
    total = batch * num_draft
    qkv = {}
    for layer_id in layer_ids:
        q = torch.randn(total, num_heads * QK_DIM, generator=generator).to(device, dtype)
        k = torch.randn(total, 1, QK_DIM, generator=generator).to(device, dtype)
        qkv[layer_id] = (q, k, k[..., :V_DIM])  # v is the latent part of k, as in DeepSeek
    return VerifyBatch(forward_batch, list(prefix_lens), num_draft, qkv)
