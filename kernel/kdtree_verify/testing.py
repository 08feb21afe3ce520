"""Synthetic target-verify inputs in SGLang's exact layout, shared by tests and benchmarks.

A case is a batch of requests with (possibly ragged) committed prefixes scattered over a paged KV
pool (fragmented slots), N draft tokens per request whose KV sits in ``k_extend``/``v_extend`` and
also in the pool at their ``out_cache_loc`` slots (SGLang writes them there before attention), and
the draft tree as SGLang's flat ``custom_mask`` (or ``None`` for a causal draft block).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .dims import QK_DIM, V_DIM
from .metadata import VerifyMetadata
from .op import deepseek_v3_sm_scale
from .reference import verify_attention_reference

MaskKind = Literal["tree", "chain", "causal"]


def random_tree_parents(num_nodes: int, generator: torch.Generator) -> list[int]:
    """A random draft tree in topological order: parent[0] = -1, parent[i] < i."""
    parents = [-1]
    for i in range(1, num_nodes):
        parents.append(int(torch.randint(0, i, (1,), generator=generator)))
    return parents


def chain_parents(num_nodes: int) -> list[int]:
    """A chain draft (EAGLE topk=1): each token's parent is the one before it."""
    return [i - 1 for i in range(num_nodes)]


def tree_visibility(parents: Sequence[int]) -> torch.Tensor:
    """[N, N] bool: row i sees itself and its ancestors (SGLang's tree mask)."""
    n = len(parents)
    visible = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            visible[i, j] = True
            j = parents[j]
    return visible


def flat_custom_mask(
    prefix_lens: Sequence[int], visibilities: Sequence[torch.Tensor], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's flat mask (per request N rows x (prefix + N) cols, prefix visible) and mask_indptr."""
    blocks, indptr = [], [0]
    for prefix_len, visible in zip(prefix_lens, visibilities, strict=True):
        n = visible.shape[0]
        block = torch.ones(n, prefix_len + n, dtype=torch.bool)
        block[:, prefix_len:] = visible
        blocks.append(block.flatten())
        indptr.append(indptr[-1] + block.numel())
    mask = torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool)
    return mask.to(dtype), torch.tensor(indptr, dtype=torch.int64)


@dataclass
class VerifyCase:
    """Arguments of the verify op plus the facts they were generated from."""

    q: torch.Tensor
    k_extend: torch.Tensor
    v_extend: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    sm_scale: float
    out_cache_loc: torch.Tensor
    prefix_lens: list[int]
    num_draft: int
    mask_kind: MaskKind
    k_scale: float = 1.0
    v_scale: float = 1.0

    def scales(self) -> dict[str, float]:
        """Keyword arguments ``k_scale``/``v_scale`` (1.0 unless the pool is fp8)."""
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}

    def metadata(self, **options: Any) -> VerifyMetadata:
        """The case's ``VerifyMetadata`` (``options``: ``plan``, ``chunk_size``)."""
        return VerifyMetadata.build(
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            self.custom_mask,
            self.mask_indptr,
            self.sm_scale,
            **options,
        )

    def layer(self) -> tuple[torch.Tensor, ...]:
        """One layer's tensors: q, k_extend, v_extend, k_buffer, v_buffer."""
        return self.q, self.k_extend, self.v_extend, self.k_buffer, self.v_buffer

    def args(self, **options: Any) -> tuple:
        """Positional arguments for ``verify_attention`` / ``verify_attention_reference``: the
        metadata (``options`` as for :meth:`metadata`), then the layer's tensors."""
        return (self.metadata(**options), *self.layer())

    @property
    def max_seq_len(self) -> int:
        return max(self.prefix_lens) + self.num_draft


def make_case(
    prefix_lens: Sequence[int],
    num_draft: int,
    num_heads: int,
    *,
    mask: MaskKind = "tree",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    index_dtype: torch.dtype = torch.int64,
    mask_dtype: torch.dtype = torch.uint8,
    strided_v: bool = True,
    pool_slack: int = 7,
    sm_scale: float | None = None,
    kv_dtype: torch.dtype | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fp8_exact_q: bool = False,
) -> VerifyCase:
    """Build a target-verify case; slots are a random permutation of the pool (fragmented).

    ``kv_dtype=torch.float8_e4m3fn`` stores the pool as SGLang's Triton backend does for MLA:
    K / k_scale rounded to e4m3 (the draft tokens' slots included), V the first 512 columns of
    those rows; ``k_extend``/``v_extend`` stay in ``dtype``. ``fp8_exact_q`` makes every q value
    an e4m3 value (SGLang's Triton fp8 path rounds q to e4m3; this keeps that rounding exact).
    """
    fp8 = kv_dtype is not None and kv_dtype != dtype
    if fp8 and kv_dtype != torch.float8_e4m3fn:
        raise ValueError(f"kv_dtype: None, dtype or torch.float8_e4m3fn, got {kv_dtype}")
    if not fp8 and (k_scale != 1.0 or v_scale != 1.0):
        raise ValueError("k_scale/v_scale: only an fp8 pool is scaled")
    gen = torch.Generator().manual_seed(seed)
    batch_size = len(prefix_lens)
    total_prefix, total_draft = sum(prefix_lens), batch_size * num_draft
    pool_size = total_prefix + total_draft + pool_slack

    slots = torch.randperm(pool_size, generator=gen)
    kv_indices = slots[:total_prefix]
    out_cache_loc = slots[total_prefix : total_prefix + total_draft]

    k_buffer = torch.randn(pool_size, 1, QK_DIM, generator=gen)
    q = torch.randn(total_draft, num_heads, QK_DIM, generator=gen)
    if fp8_exact_q:
        q = q.to(torch.float8_e4m3fn).float()
    k_extend = torch.randn(total_draft, 1, QK_DIM, generator=gen)
    k_buffer[out_cache_loc] = k_extend  # SGLang saves the draft KV before attention
    v_buffer_full = None if strided_v else k_buffer[..., :V_DIM].clone()

    qo_indptr = torch.arange(batch_size + 1, dtype=torch.int64) * num_draft
    kv_indptr = torch.tensor(
        [0, *torch.tensor(list(prefix_lens)).cumsum(0).tolist()], dtype=torch.int64
    )

    custom_mask, mask_indptr = _case_mask(prefix_lens, num_draft, mask, mask_dtype, gen)

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype)

    k_extend, v_extend, k_buffer, v_buffer = _place_kv(
        put(k_extend), put(k_buffer), v_buffer_full, put, k_scale if fp8 else None
    )
    return VerifyCase(
        q=put(q),
        k_extend=k_extend,
        v_extend=v_extend,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        qo_indptr=qo_indptr.to(device),
        kv_indptr=kv_indptr.to(device=device, dtype=index_dtype),
        kv_indices=kv_indices.to(device=device, dtype=index_dtype),
        custom_mask=None if custom_mask is None else custom_mask.to(device),
        mask_indptr=None if mask_indptr is None else mask_indptr.to(device),
        sm_scale=deepseek_v3_sm_scale() if sm_scale is None else sm_scale,
        out_cache_loc=out_cache_loc.to(device),
        prefix_lens=list(prefix_lens),
        num_draft=num_draft,
        mask_kind=mask,
        k_scale=k_scale if fp8 else 1.0,
        v_scale=v_scale if fp8 else 1.0,
    )


def _case_mask(
    prefix_lens: Sequence[int],
    num_draft: int,
    mask: MaskKind,
    mask_dtype: torch.dtype,
    gen: torch.Generator,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(custom_mask, mask_indptr) of a case: none for causal, else one tree (or chain) a request."""
    if mask == "causal":
        return None, None
    make_parents = chain_parents if mask == "chain" else lambda n: random_tree_parents(n, gen)
    visibilities = [tree_visibility(make_parents(num_draft)) for _ in prefix_lens]
    return flat_custom_mask(prefix_lens, visibilities, mask_dtype)


def _place_kv(
    k_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer_full: torch.Tensor | None,
    put: Callable[[torch.Tensor], torch.Tensor],
    fp8_k_scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_extend, v_extend, k_buffer, v_buffer) as the case stores them: V the first columns of
    K's rows, or (``v_buffer_full``) a separate copy; an fp8 pool scaled by ``fp8_k_scale``."""
    if fp8_k_scale is not None:
        # SGLang: k.clone().div_(k_scale) in the model dtype, then the pool's cast to e4m3.
        k_buffer = (k_buffer / fp8_k_scale).to(torch.float8_e4m3fn)
        v_buffer_full = None  # the CUDA kernel reads an fp8 pool's V from its K rows
    if v_buffer_full is None:
        return k_extend, k_extend[..., :V_DIM], k_buffer, k_buffer[..., :V_DIM]
    return k_extend, k_extend[..., :V_DIM].contiguous(), k_buffer, put(v_buffer_full)


def sglang_extend_attention(
    metadata: VerifyMetadata,
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    max_draft_tokens: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """SGLang 0.5.23's own ``extend_attention_fwd`` called as its Triton backend calls it on target
    verify (is_causal=True, prefix custom-mask columns skipped; ``k_scale``/``v_scale`` are its
    k_descale / v_descale, the layer's scales with an fp8 pool, else 1.0): the oracle of the tests,
    the reference engine's GPU baseline and the benchmarks' speed anchor.

    On a CPU machine this needs ``TRITON_INTERPRET=1`` set before sglang is first imported, and
    float32 tensors (bf16 is not reliable in the interpreter). ``max_draft_tokens`` is SGLang's
    ``max_extend_len``; computed from qo_indptr (a host sync) when not given. ``out`` [T, H, 512]
    is written when given (a timed loop allocates nothing), else allocated.
    """
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    qo_indptr = metadata.qo_indptr
    if max_draft_tokens is None:
        max_draft_tokens = int((qo_indptr[1:] - qo_indptr[:-1]).max())
    if out is None:
        out = torch.empty(*q.shape[:2], v_buffer.shape[-1], dtype=q.dtype, device=q.device)
    extend_attention_fwd(
        q,
        k_extend.contiguous(),
        v_extend.contiguous(),
        out,
        k_buffer,
        v_buffer,
        qo_indptr,
        metadata.kv_indptr,
        metadata.kv_indices,
        metadata.custom_mask,
        True,
        metadata.mask_indptr,
        max_draft_tokens,
        k_scale,
        v_scale,
        sm_scale=metadata.sm_scale,
    )
    return out


def boost_prefix_keys(case: VerifyCase, boosts: dict[int, float]) -> VerifyCase:
    """Make request 0's scores jump: its prefix token at position ``j`` gets the key (and so the
    value) ``boosts[j] x u``, u the unit mean direction of the request's queries, so its score is
    ~``boosts[j] x sm_scale x (q . u)`` for every query row, far above the random keys' scores.

    A schedule of growing boosts at late positions makes an online softmax move its running max in
    later KV tiles (the kernel's rare rescale path), a large early boost leaves every later tile
    far below the max. Modifies ``case`` in place and returns it.
    """
    prefix = case.prefix_lens[0]
    if any(not 0 <= j < prefix for j in boosts):
        raise ValueError(f"boost positions must lie in request 0's prefix [0, {prefix})")
    rows = case.q[: case.num_draft].float().reshape(-1, QK_DIM)
    direction = rows.mean(dim=0)
    direction = direction / direction.norm()
    for j, strength in boosts.items():
        slot = int(case.kv_indices[j])
        case.k_buffer[slot, 0] = (strength * direction).to(case.k_buffer.dtype)
    return case


def assert_close_bf16(out: torch.Tensor, ref: torch.Tensor, what: str, factor: float = 1.0) -> None:
    """``out`` within the bf16 bound of the float32 ``ref``, elementwise: 2^-7 relative (two bf16
    roundings: P before the P V MMA, and the output) plus 2^-8 x max|ref| for entries near zero,
    which are sums of terms of the size of max|ref| (tests/gpu/test_kernel.py says more)."""
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    scale = float(ref.abs().max())
    bound = factor * (2**-7 * ref.abs() + 2**-8 * scale)
    excess = (out - ref).abs() - bound
    worst = float(excess.max())
    assert worst <= 0, (
        f"{what}: max |out - ref| exceeds the bf16 bound by {worst:.3g} "
        f"(max|ref| = {scale:.3g}, max err = {float((out - ref).abs().max()):.3g})"
    )


def assert_lse_close(lse: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """The float32 LSE within 2e-3 absolute (ex2.approx and another summation order); equal
    infinities (rows that see nothing) agree."""
    both_inf = torch.isinf(lse) & torch.isinf(ref) & (lse == ref)
    diff = torch.where(both_inf, torch.zeros_like(lse), (lse - ref).abs())
    assert float(diff.max()) <= 2e-3, f"{what}: lse differs by {float(diff.max()):.3g}"


def assert_matches_reference(
    out: torch.Tensor, lse: torch.Tensor, args: tuple, what: str, **scales: float
) -> None:
    """The op's output and LSE for ``args`` (and an fp8 pool's ``k_scale``/``v_scale``) against
    the float32 reference (the two bounds above)."""
    ref_out, ref_lse = verify_attention_reference(*args, return_lse=True, **scales)
    assert_close_bf16(out, ref_out, what)
    assert_lse_close(lse, ref_lse, what)
