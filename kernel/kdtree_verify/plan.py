"""Scheduling metadata and workspace of the CUDA kernel, planned once per forward.

Like FlashMLA's ``get_mla_metadata`` or FlashInfer's ``plan()``: the host fixes the *static*
maxima (batch size, total draft tokens, heads -> a fixed grid and a fixed workspace), and a small
plan kernel derives everything that depends on tensor values (per-request prefix lengths, the row
tiles, the KV split size) on the device from ``qo_indptr`` / ``kv_indptr``. No host sync and no
allocation per call, so a plan can be made before CUDA-graph capture and refreshed inside it with
``VerifyPlan.update`` once per forward; every layer then reuses it.

Work decomposition. Request b has N_b draft tokens and prefix L_b; its M_b = N_b x H query rows
(token-major, head-minor) are cut into row tiles of ``BLOCK_M`` rows; its virtual KV sequence
(L_b prefix tokens then the N_b draft tokens) is cut into splits of ``chunk`` tokens. One CTA
handles one (row tile, split). ``chunk`` is uniform over the batch (``split_chunk``): start from
``max(ceil(sum_b tiles_b * (L_b + N_b) / target_ctas), ceil(max_b (L_b + N_b) / max_splits), 64)``
rounded up to 32, so that no request exceeds ``max_splits``; then take the smallest multiple of 32
at or above it whose CTAs, ``sum_b tiles_b * ceil((L_b + N_b) / chunk)``, fit in ``target_ctas``
(one wave), where one split per row tile fits at all.

Workspace (bytes; each region starts 256-byte aligned), with S = ``num_tile_slots`` and
P = ``max_splits * S * BLOCK_M`` partial rows when ``max_splits > 1`` (else 0):

    48 * S (TileMeta per row tile: its request's metadata and its index) + 4 (chunk)
    + 4 * P (partial LSE) + 2048 * P (partial outputs, fp32 x 512)
    + 4 * P (each split's row maxima: an fp8 pool with SGLang's Triton numerics)

``num_tile_slots = ceil((T_total * H + B * (BLOCK_M - 1)) / BLOCK_M)`` bounds sum_b ceil(M_b /
BLOCK_M) for any split of T_total tokens into B requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .dims import V_DIM

BLOCK_M = 32
"""Query rows (draft token x head) per CTA; must equal kBlockM in csrc/verify_config.h."""
TILE_META_BYTES = 48
"""sizeof(TileMeta) in csrc/verify_params.h."""
MAX_SPLITS = 128
"""Cap on KV splits per row tile (kMaxSplits in csrc/verify_config.h)."""
ALIGN = 256
BLOCK_N = 32
"""KV tokens per tile (kBlockN); split sizes are multiples of it."""
CHUNK_MIN_TOKENS = 2 * BLOCK_N
"""Smallest split (kChunkMinTokens)."""


@dataclass(frozen=True)
class WorkspaceLayout:
    """Byte offsets of the workspace regions and the total size."""

    tiles: int
    chunk: int
    lse_part: int
    o_part: int
    row_max: int
    total_bytes: int

    def offsets(self) -> list[int]:
        """The order the extension expects."""
        return [self.tiles, self.chunk, self.lse_part, self.o_part, self.row_max]


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def num_tile_slots(batch_size: int, num_heads: int, total_tokens: int) -> int:
    """Upper bound on the row tiles of any batch with these static sizes (see module doc)."""
    return max(1, math.ceil((total_tokens * num_heads + batch_size * (BLOCK_M - 1)) / BLOCK_M))


def choose_max_splits(num_heads: int, total_tokens: int, target_ctas: int) -> int:
    """Split cap: enough splits that the expected row tiles x splits reach ~2 waves of CTAs.

    With many row tiles (large H x T x B) the grid is full without splitting and the cap drops to
    1, which also drops the partial buffers and the combine kernel.
    """
    expected_tiles = max(1, math.ceil(total_tokens * num_heads / BLOCK_M))
    return max(1, min(MAX_SPLITS, math.ceil(2 * target_ctas / expected_tiles)))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(x: int, step: int) -> int:
    return _ceil_div(x, step) * step


def split_chunk(
    requests: Sequence[tuple[int, int]], num_heads: int, target_ctas: int, max_splits: int
) -> int:
    """KV tokens per split for ``requests`` = [(draft tokens N_b, prefix L_b)]: the plan kernel's
    rule (``one_wave_chunk`` in csrc/verify_kernel.cu), stated on the host for tests and tools."""
    shapes = [(math.ceil(n * num_heads / BLOCK_M), prefix + n) for n, prefix in requests if n > 0]
    if not shapes:
        return CHUNK_MIN_TOKENS
    tiles = sum(t for t, _ in shapes)
    work = sum(t * length for t, length in shapes)
    max_len = max(length for _, length in shapes)
    target = max(1, target_ctas)
    chunk = max(_ceil_div(work, target), _ceil_div(max_len, max_splits), CHUNK_MIN_TOKENS)
    chunk = _round_up(chunk, BLOCK_N)

    def ctas(c: int) -> int:
        return sum(t * _ceil_div(length, c) for t, length in shapes)

    if tiles > target or ctas(chunk) <= target:
        return chunk
    hi = _round_up(max_len, BLOCK_N)
    if target > tiles:
        hi = min(hi, _round_up(_ceil_div(work, target - tiles), BLOCK_N))
    lo = chunk
    while hi - lo > BLOCK_N:
        mid = (lo + hi) // 2 // BLOCK_N * BLOCK_N
        if ctas(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def workspace_layout(slots: int, max_splits: int) -> WorkspaceLayout:
    """Offsets and total bytes of the workspace (the formula in the module docstring)."""
    if slots < 1 or not 1 <= max_splits <= MAX_SPLITS:
        raise ValueError(
            f"workspace_layout: need slots >= 1 and 1 <= max_splits <= {MAX_SPLITS}; "
            f"got {slots}, {max_splits}"
        )
    partial_rows = max_splits * slots * BLOCK_M if max_splits > 1 else 0
    off = 0
    tiles = off
    off = _align(off + TILE_META_BYTES * slots)
    chunk = off
    off = _align(off + 4)
    lse_part = off
    off = _align(off + 4 * partial_rows)
    o_part = off
    off = _align(off + 4 * V_DIM * partial_rows)
    row_max = off
    off = _align(off + 4 * partial_rows)
    return WorkspaceLayout(tiles, chunk, lse_part, o_part, row_max, off)


@dataclass
class VerifyPlan:
    """Static sizes, the workspace, and (after ``update``) the device-side schedule."""

    batch_size: int
    num_heads: int
    total_tokens: int
    num_tile_slots: int
    max_splits: int
    target_ctas: int
    layout: WorkspaceLayout
    workspace: torch.Tensor

    def matches(self, batch_size: int, num_heads: int, total_tokens: int) -> bool:
        return (batch_size, num_heads, total_tokens) == (
            self.batch_size,
            self.num_heads,
            self.total_tokens,
        )

    def check_workspace(self) -> None:
        """Refuse a workspace that does not hold the layout (before any kernel can overrun it)."""
        ws = self.workspace
        if (
            ws.dtype != torch.uint8
            or not ws.is_contiguous()
            or ws.numel() < self.layout.total_bytes
        ):
            raise ValueError(
                f"plan.workspace: needs a contiguous uint8 tensor of at least "
                f"{self.layout.total_bytes} bytes, got {ws.dtype} with {ws.numel()} elements"
            )
        if ws.data_ptr() % ALIGN:
            raise ValueError(f"plan.workspace: must be {ALIGN}-byte aligned")

    def update(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        mask_indptr: torch.Tensor | None = None,
    ) -> None:
        """Recompute the schedule on the device for this forward's metadata (graph-safe)."""
        from ._build import load

        if qo_indptr.shape[0] != self.batch_size + 1 or kv_indptr.shape[0] != self.batch_size + 1:
            raise ValueError(
                f"plan is for batch {self.batch_size}; got qo_indptr of {qo_indptr.shape[0]} and "
                f"kv_indptr of {kv_indptr.shape[0]} entries"
            )
        self.check_workspace()
        load().plan(
            qo_indptr,
            kv_indptr,
            mask_indptr,
            self.workspace,
            self.layout.offsets(),
            self.batch_size,
            self.num_heads,
            self.num_tile_slots,
            self.max_splits,
            self.target_ctas,
        )


def default_target_ctas(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> int:
    """One wave: SMs x attention CTAs resident per SM (the occupancy query runs on ``device``)."""
    from ._build import load

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    with torch.cuda.device(device):
        return sms * int(load().ctas_per_sm(dtype == torch.bfloat16))


def make_plan(
    batch_size: int,
    num_heads: int,
    total_tokens: int,
    device: torch.device | str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    target_ctas: int | None = None,
    max_splits: int | None = None,
) -> VerifyPlan:
    """Allocate a plan for these static sizes (call outside CUDA-graph capture, then ``update``)."""
    if batch_size < 1 or num_heads < 1 or total_tokens < 0:
        raise ValueError(
            "make_plan: need batch_size >= 1, num_heads >= 1, total_tokens >= 0; "
            f"got {batch_size}, {num_heads}, {total_tokens}"
        )
    device = torch.device(device)
    if target_ctas is None:
        target_ctas = default_target_ctas(device, dtype)
    slots = num_tile_slots(batch_size, num_heads, total_tokens)
    if max_splits is None:
        max_splits = choose_max_splits(num_heads, total_tokens, target_ctas)
    layout = workspace_layout(slots, max_splits)
    workspace = torch.empty(layout.total_bytes, dtype=torch.uint8, device=device)
    return VerifyPlan(
        batch_size, num_heads, total_tokens, slots, max_splits, target_ctas, layout, workspace
    )
