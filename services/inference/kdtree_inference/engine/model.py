"""A tiny DeepSeek-V3-shaped decoder with absorbed MLA, seeded weights and optional safetensors.

Per layer: RMSNorm -> MLA (low-rank q, compressed latent KV of 512 + decoupled rope of 64, the
key up-projection absorbed into the query and the value up-projection applied after attention, as
SGLang's DeepseekV2AttentionMLA.forward_absorb does) -> residual -> RMSNorm -> SwiGLU MLP ->
residual. Attention itself is delegated to an ``AttentionBackend`` in SGLang's extend/verify layout;
the latent KV of the new tokens is written to their ``out_cache_loc`` slots first.

Weight names follow the DeepSeek-V3 checkpoint (``model.layers.N.self_attn.kv_b_proj.weight``...),
so ``save_weights`` / ``load_weights`` round-trip through safetensors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from .attention import AttentionBackend, ExtendMetadata
from .config import KV_LORA_RANK, QK_ROPE_HEAD_DIM, ModelConfig
from .kv_pool import MLAKVPool
from .tokenizer import EOS_ID

WEIGHTS_FILE = "model.safetensors"


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter (Linear weights are [out, in])."""
    h, heads = cfg.hidden_size, cfg.num_heads
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (cfg.vocab_size, h),
    }
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_a_proj.weight": (cfg.q_lora_rank, h),
            p + "self_attn.q_a_layernorm.weight": (cfg.q_lora_rank,),
            p + "self_attn.q_b_proj.weight": (
                heads * (cfg.qk_nope_head_dim + QK_ROPE_HEAD_DIM),
                cfg.q_lora_rank,
            ),
            p + "self_attn.kv_a_proj_with_mqa.weight": (KV_LORA_RANK + QK_ROPE_HEAD_DIM, h),
            p + "self_attn.kv_a_layernorm.weight": (KV_LORA_RANK,),
            p + "self_attn.kv_b_proj.weight": (
                heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                KV_LORA_RANK,
            ),
            p + "self_attn.o_proj.weight": (h, heads * cfg.v_head_dim),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
        }
    return shapes


def seeded_weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Deterministic float32 weights from ``cfg.seed`` (same on every machine: CPU generator)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    weights = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape)
            continue
        std = 1.0 / math.sqrt(shape[-1])
        if name == "model.embed_tokens.weight":
            std = 1.0
        elif name == "lm_head.weight":
            # The final RMSNorm makes the hidden state unit-RMS, so logits have std ~logit_scale:
            # a wide spread keeps greedy top-1/top-2 gaps far from ties (see margins.py).
            std = cfg.logit_scale / math.sqrt(shape[-1])
        weights[name] = torch.randn(shape, generator=gen) * std
    # Readable output: only printable ASCII and EOS get full-scale logits; other bytes and
    # specials are damped so they almost never win the argmax.
    damp = torch.full((cfg.vocab_size, 1), 0.1)
    damp[32:127] = 1.0
    damp[EOS_ID] = 1.0
    weights["lm_head.weight"] *= damp
    return weights


def save_weights(weights: dict[str, torch.Tensor], directory: str | Path) -> Path:
    from safetensors.torch import save_file

    path = Path(directory) / WEIGHTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path))
    return path


def seeded_digest(cfg: ModelConfig) -> str:
    """sha256 of what seeded weights are made from: the model config (shape, seed, scale)."""
    canonical = json.dumps(dataclasses.asdict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(("seeded:" + canonical).encode()).hexdigest()


def load_weights(cfg: ModelConfig, directory: str | Path) -> dict[str, torch.Tensor]:
    """Weights from ``directory/model.safetensors``; every expected tensor must be there, in shape."""
    return load_weights_with_digest(cfg, directory)[0]


def load_weights_with_digest(
    cfg: ModelConfig, directory: str | Path
) -> tuple[dict[str, torch.Tensor], dict[str, str | None]]:
    """``load_weights`` plus the file's resolved path and the sha256 of the very bytes loaded."""
    from safetensors.torch import load as load_bytes

    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in {directory}")
    data = path.read_bytes()
    identity = {"path": str(path.resolve()), "sha256": hashlib.sha256(data).hexdigest()}
    loaded = load_bytes(data)
    expected = weight_shapes(cfg)
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise ValueError(
            f"{path}: missing tensors {missing[:5]}{'...' if len(missing) > 5 else ''}"
        )
    for name, shape in expected.items():
        if tuple(loaded[name].shape) != shape:
            raise ValueError(f"{path}: {name} has shape {tuple(loaded[name].shape)}, want {shape}")
    return {name: loaded[name].float() for name in expected}, identity


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class TinyMLAModel:
    """Forward of T new tokens (any mix of prefill, decode and tree-verify requests)."""

    def __init__(
        self,
        cfg: ModelConfig,
        attention: AttentionBackend,
        weights: dict[str, torch.Tensor] | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        fault_layer: int | None = None,
        fault_scale: float = 1.0,
    ) -> None:
        self.cfg = cfg
        self.attention = attention
        self.device = torch.device(device)
        self.dtype = dtype
        self.fault_layer = fault_layer
        self.fault_scale = fault_scale
        source = weights if weights is not None else seeded_weights(cfg)
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in source.items()}
        # Absorption needs kv_b split per head: W_UK [H, nope, 512] and W_UV [H, v, 512].
        self.w_uk, self.w_uv = [], []
        for i in range(cfg.num_layers):
            kv_b = self.w[f"model.layers.{i}.self_attn.kv_b_proj.weight"].view(
                cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, KV_LORA_RANK
            )
            self.w_uk.append(kv_b[:, : cfg.qk_nope_head_dim])
            self.w_uv.append(kv_b[:, cfg.qk_nope_head_dim :])
        inv_freq = 1.0 / (
            cfg.rope_theta
            ** (torch.arange(0, QK_ROPE_HEAD_DIM, 2, dtype=torch.float32) / QK_ROPE_HEAD_DIM)
        )
        angles = torch.outer(torch.arange(cfg.max_position, dtype=torch.float32), inv_freq)
        self.cos = angles.cos().to(device)
        self.sin = angles.sin().to(device)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE on the last dim (64) of x [T, ..., 64] at ``positions`` [T]."""
        cos = self.cos[positions].to(x.dtype)
        sin = self.sin[positions].to(x.dtype)
        while cos.dim() < x.dim():
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        x1, x2 = x[..., : QK_ROPE_HEAD_DIM // 2], x[..., QK_ROPE_HEAD_DIM // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: ExtendMetadata,
        pool: MLAKVPool,
    ) -> torch.Tensor:
        """Logits [T, vocab] (float32) for every new token; their KV lands in out_cache_loc.

        Batch-invariant: every dense op (projections, norms, MLP, lm_head) runs once per request
        on that request's rows alone, so a BLAS kernel chosen by the row count of the whole batch
        can never change a request's numerics; attention is per request already. A request's
        logits are bit-identical whichever requests share its forward.
        """
        cfg, w = self.cfg, self.w
        if int(positions.max()) >= cfg.max_position:
            raise ValueError(f"position {int(positions.max())} >= max_position {cfg.max_position}")
        bounds = meta.qo_indptr.tolist()
        segments = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]
        x = w["model.embed_tokens.weight"][input_ids]
        for i in range(cfg.num_layers):
            q_full, k_extend, v_extend = _per_request(
                segments, lambda xs, ps, i=i: self._attention_inputs(i, xs, ps), x, positions
            )
            # SGLang saves the new tokens' KV to out_cache_loc *before* running attention.
            pool.write(i, meta.out_cache_loc, k_extend)
            self.attention.layer = i  # validate mode reports its comparison per layer
            attn = self.attention(
                q_full,
                k_extend,
                v_extend,
                pool.get_key_buffer(i),
                pool.get_value_buffer(i),
                meta,
                cfg.sm_scale,
            )  # [T, H, 512]
            if i == self.fault_layer:
                # Test-only perturbation: a deliberately wrong candidate for parity tests.
                attn = attn * self.fault_scale
            (x,) = _per_request(
                segments, lambda xs, a, i=i: (self._attention_output(i, xs, a),), x, attn
            )
        (logits,) = _per_request(segments, lambda xs: (self._logits(xs),), x)
        return logits

    def _attention_inputs(
        self, i: int, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``i``'s absorbed queries [t, H, 576] and the new latent KV rows of ``x`` [t, h]."""
        cfg, w = self.cfg, self.w
        p = f"model.layers.{i}."
        t, heads, nope = x.shape[0], cfg.num_heads, cfg.qk_nope_head_dim
        h = _rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        # Query: low-rank, then per head [nope | rope]; the nope part is absorbed into the
        # latent space through W_UK so it can be scored against the 512-wide latent KV.
        q_lat = _rms_norm(
            h @ w[p + "self_attn.q_a_proj.weight"].T,
            w[p + "self_attn.q_a_layernorm.weight"],
            cfg.rms_norm_eps,
        )
        q = (q_lat @ w[p + "self_attn.q_b_proj.weight"].T).view(t, heads, -1)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        q_absorbed = torch.einsum("thn,hnc->thc", q_nope, self.w_uk[i])
        q_full = torch.cat([q_absorbed, self._rope(q_pe, positions)], dim=-1).contiguous()
        # Key/value: one shared 576-wide row per token (MQA over the latent).
        kv = h @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
        latent = _rms_norm(
            kv[:, :KV_LORA_RANK], w[p + "self_attn.kv_a_layernorm.weight"], cfg.rms_norm_eps
        )
        k_pe = self._rope(kv[:, KV_LORA_RANK:], positions)
        k_extend = torch.cat([latent, k_pe], dim=-1).unsqueeze(1)  # [t, 1, 576]
        v_extend = latent.unsqueeze(1).contiguous()  # [t, 1, 512]
        return q_full, k_extend, v_extend

    def _attention_output(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream after layer ``i``: o_proj of ``attn`` [t, H, 512], then the MLP."""
        cfg, w = self.cfg, self.w
        p = f"model.layers.{i}."
        o = torch.einsum("thc,hvc->thv", attn.to(self.dtype), self.w_uv[i]).reshape(x.shape[0], -1)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        return x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = _rms_norm(x, self.w["model.norm.weight"], self.cfg.rms_norm_eps)
        # Logits in float32 from the bf16 hidden state: bf16 logits are quantized to
        # 1/16 at this scale, which would turn many greedy choices into exact ties.
        return x.float() @ self.w["lm_head.weight"].float().T


def _per_request(
    segments: list[tuple[int, int]],
    fn: Callable[..., tuple[torch.Tensor, ...]],
    *rows: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """``fn`` applied to each request's rows of ``rows`` alone, results concatenated in order.

    Each slice is cloned: a fresh allocation has the allocator's alignment, so BLAS sees the same
    shape *and* the same alignment for a request wherever its rows sit in the batch.
    """
    parts = [fn(*(r[lo:hi].clone() for r in rows)) for lo, hi in segments]
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat(column) for column in zip(*parts, strict=True))
