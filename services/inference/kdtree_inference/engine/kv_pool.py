"""Paged MLA KV pool, one slot per token (SGLang page_size=1), with deliberately fragmented slots.

Per layer the pool holds ``k_buffer`` [size, 1, 576] (latent 512 + rope 64); ``v_buffer`` is the
strided view ``k_buffer[..., :512]``, exactly as SGLang's MLATokenToKVPool hands them to attention.
Free slots are handed out in a seeded random order so every request's ``kv_indices`` are scattered
across the pool: a kernel that silently assumed contiguous KV would be caught by every test.
Slot 0 is reserved (SGLang uses it as the padding slot) and never handed out.
"""

from __future__ import annotations

import random

import torch

from .config import KV_LORA_RANK, QK_HEAD_DIM_ABSORBED


class PoolExhaustedError(RuntimeError):
    """More slots were requested than are free."""


class MLAKVPool:
    def __init__(
        self,
        size: int,
        num_layers: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        if size < 2:
            raise ValueError(f"pool size must be at least 2 slots, got {size}")
        self.size = size
        self.num_layers = num_layers
        self.device = torch.device(device)
        self.k_buffers = [
            torch.zeros(size, 1, QK_HEAD_DIM_ABSORBED, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        free = list(range(1, size))
        random.Random(seed).shuffle(free)
        self._free = free  # popped from the end: order is the shuffled order

    @property
    def num_free(self) -> int:
        return len(self._free)

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self.k_buffers[layer]

    def get_value_buffer(self, layer: int) -> torch.Tensor:
        # A strided view, not a copy: the verify op must cope with v's row stride of 576.
        return self.k_buffers[layer][..., :KV_LORA_RANK]

    def alloc(self, count: int) -> torch.Tensor:
        """``count`` free slot indices (int64 on the pool's device), scattered across the pool."""
        if count > len(self._free):
            raise PoolExhaustedError(f"KV pool has {len(self._free)} free slots, {count} requested")
        taken = self._free[len(self._free) - count :]
        del self._free[len(self._free) - count :]
        return torch.tensor(taken, dtype=torch.int64, device=self.device)

    def free(self, slots: torch.Tensor | list[int]) -> None:
        values = slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
        # Returned slots go to the front so the next allocations keep drawing scattered ones.
        self._free[:0] = values

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor) -> None:
        """Store k [n, 1, 576] at ``slots`` (v is its first 512 columns, so it is stored too)."""
        self.k_buffers[layer][slots] = k.to(self.k_buffers[layer].dtype)
