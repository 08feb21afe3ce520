#!/usr/bin/env python3
"""Write a seeded DeepSeek-V3-architecture model directory that SGLang loads with its normal loader.

The directory holds ``config.json``, a byte-level BPE tokenizer (trained here, offline, on a
deterministic synthetic corpus) and ``model.safetensors`` in the Hugging Face DeepSeek-V3 layout,
including one NextN (MTP) layer, so EAGLE drafts with the model itself
(``DeepseekV3ForCausalLMNextN``; SGLang defaults the draft path to the model path).

Why not ``--load-format dummy``: random weights at SGLang's dummy scale give near-uniform logits,
so nearly every greedy step is a near-tie and a parity comparison tests nothing. Here the weights
are drawn from one seed and scaled:

- every projection is normalised by its fan-in, and the final logits have standard deviation
  ``logit_scale`` (8 by default), so the greedy top-1/top-2 margin is usually clear (the tiny
  model's median is about 1.6 nats in transformers' DeepSeek-V3 on random prompts);
- the residual branches (attention and MLP outputs) are scaled by ``branch_scale`` (0.1), and
  the NextN layer's ``eh_proj`` passes the next token's embedding through. The draft then
  predicts what the target would predict from the current token alone, and the target departs
  from that where its context (the attention over the prefix) moves the argmax: for the tiny
  model at 0.1, about 28% of positions (16% agree at 0.5, 85% at 0.05). The acceptance rate
  that follows is measured by the end-to-end run, not assumed.

Three presets (``--preset``):

- ``tiny``: 1,024 hidden, 16 heads, 2 layers (dense + MoE), q_lora 384. Starts in seconds;
  for correctness.
- ``rank``: one GPU's share of DeepSeek-V3 at TP8, for speed. Attention at DeepSeek-V3's own
  dimensions (hidden 7,168, q_lora 1,536, kv_lora 512, rope 64, nope 128, v 128) with 16 heads
  (128 / 8); the dense MLP at 18,432 / 8 = 2,304; each expert at 2,048 / 8 = 256 with 16 routed
  experts (top-8) and 1 shared, instead of 256 routed. ``--layers`` layers (default 4: one dense,
  the rest MoE) instead of 61, plus the NextN layer; vocabulary 4,096 (this tokenizer).
- ``kimi-rank``: one TP8 rank's share of Kimi K2 (the DeepSeek-V3 architecture with 64 heads,
  384 experts and its own vocabulary and RoPE): 8 heads (64 / 8) at the same MLA dimensions as
  ``rank``; Kimi's vocabulary of 163,840 ids; Kimi's RoPE for 256k positions (``rope_theta``
  50,000, YaRN factor 64 over 4,096 original positions, ``beta_fast`` = ``beta_slow`` =
  ``mscale`` = ``mscale_all_dim`` = 1, ``max_position_embeddings`` 262,144); the MoE as a rank
  computes it per token (top-8 routed + 1 shared, each 2,048 / 8 = 256 wide) but with 16 routed
  experts instead of 384, so that the weights fit; ``routed_scaling_factor`` 2.827 as Kimi's.
  The embedding and the LM head are 163,840 x 7,168 each (2.35 GB apiece in bf16); the
  tokenizer keeps its 4,096 ids, so text prompts use ids below 4,096 and ``input_ids`` prompts
  any id below 163,840 (SGLang checks ids against the model's vocabulary, not the tokenizer's,
  and decodes ids beyond the tokenizer as id 0).

Usage: python -m kdtree_bench.models.make_model --preset tiny OUT_DIR [--seed N] [--device cuda]
    [--perturb LAYER:SIZE]

``--perturb LAYER:SIZE`` (TEST ONLY, for measuring the parity gate's resolution on SGLang) adds
seeded noise of relative size SIZE to every matrix of target layer LAYER, as the reference
engine's ``KDTREE_INJECT_FAULT=weight:LAYER:SIZE`` does (``kdtree_inference.faults``). The
weights are bf16, so a SIZE well below bf16's relative step (2^-8) is mostly rounded away:
``config.json``'s ``kdtree_model.perturb`` records the size asked for and the one realized.
Needs torch, safetensors, tokenizers and transformers (all on the GPU machine).
``--device meta`` draws nothing: the tensors have their names and shapes only (for tests).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

VOCAB = 4096
"""The tokenizer's size, and the vocabulary of the presets that do not set their own."""
BOS, EOS = 0, 1
KIMI_VOCAB = 163840

BASE_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB,
    "moe_layer_freq": 1,
    "num_nextn_predict_layers": 1,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_shared_experts": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,  # a 64k prompt plus its new tokens fits
    "rope_theta": 10000,
    "rope_scaling": None,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_cache": True,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "torch_dtype": "bfloat16",
}

PRESETS = {
    "tiny": {
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "moe_intermediate_size": 256,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": 384,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
    },
    "rank": {
        "hidden_size": 7168,
        "intermediate_size": 18432 // 8,
        "moe_intermediate_size": 2048 // 8,
        "num_hidden_layers": 4,
        "first_k_dense_replace": 1,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": 1536,
        "n_routed_experts": 16,
        "num_experts_per_tok": 8,
    },
    "kimi-rank": {
        "vocab_size": KIMI_VOCAB,
        "hidden_size": 7168,
        "intermediate_size": 18432 // 8,
        "moe_intermediate_size": 2048 // 8,
        "num_hidden_layers": 4,
        "first_k_dense_replace": 1,
        "num_attention_heads": 64 // 8,
        "num_key_value_heads": 64 // 8,
        "q_lora_rank": 1536,
        "n_routed_experts": 16,
        "num_experts_per_tok": 8,
        "routed_scaling_factor": 2.827,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 64.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    },
}

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def model_name(preset: str, layers: int | None = None) -> str:
    """What records call the model: the preset, with its layer count where ``layers`` changed it
    (``rank-61-layers``), so that runs of different depths never share a row."""
    if layers is None or layers == model_config(preset)["num_hidden_layers"]:
        return preset
    return f"{preset}-{layers}-layers"


def model_config(preset: str, layers: int | None = None) -> dict:
    """config.json of a preset; ``layers`` overrides its number of target layers."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    config = {**BASE_CONFIG, **PRESETS[preset]}
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be at least 1, got {layers}")
        config["num_hidden_layers"] = layers
        config["first_k_dense_replace"] = min(config["first_k_dense_replace"], layers)
    return config


def _corpus() -> Iterator[str]:
    """Deterministic synthetic text with enough variety for a 4,096-entry BPE vocabulary."""
    rng = random.Random(0)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [26 - i for i in range(len(letters))]
    words = ["".join(rng.choices(letters, weights, k=rng.randint(2, 9))) for _ in range(6000)]
    words += [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "kd",
        "tree",
        "nearest",
        "neighbour",
        "query",
    ]
    for i in range(4000):
        line = " ".join(rng.choice(words) for _ in range(24))
        yield f"{line} {i} {rng.randint(0, 10**6)}.\n"


def write_tokenizer(out: Path, max_length: int) -> None:
    """A byte-level BPE tokenizer with <bos>=0 and <eos>=1, saved as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    if tok.token_to_id("<bos>") != BOS or tok.token_to_id("<eos>") != EOS:
        raise RuntimeError("the tokenizer's special tokens did not get ids 0 and 1")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", model_max_length=max_length
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


class _Weights:
    """Seeded tensors, each normalised by its fan-in and cast to bf16 as it is made."""

    def __init__(self, seed: int, device: str) -> None:
        # "meta": names and shapes only, nothing drawn or stored.
        self.meta = device == "meta"
        self.generator = None if self.meta else torch.Generator(device=device).manual_seed(seed)
        self.device = device
        self.tensors: dict[str, torch.Tensor] = {}

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> None:
        if self.meta:
            self.tensors[name] = torch.empty(shape, dtype=torch.bfloat16, device="meta")
            return
        t = torch.randn(shape, generator=self.generator, device=self.device, dtype=torch.float32)
        self.tensors[name] = (t * std).to(torch.bfloat16).cpu()

    def linear(self, name: str, out_features: int, in_features: int, gain: float = 1.0) -> None:
        self.normal(name, (out_features, in_features), gain / math.sqrt(in_features))

    def fill(self, name: str, shape: tuple[int, ...], value: float, dtype=torch.bfloat16) -> None:
        device = "meta" if self.meta else "cpu"
        self.tensors[name] = torch.full(shape, value, dtype=dtype, device=device)


def _decoder_layer(w: _Weights, prefix: str, config: dict, moe: bool, branch_scale: float) -> None:
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    q_lora, kv_lora = config["q_lora_rank"], config["kv_lora_rank"]
    nope, rope, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    a = f"{prefix}.self_attn"
    w.fill(f"{prefix}.input_layernorm.weight", (hidden,), 1.0)
    w.fill(f"{prefix}.post_attention_layernorm.weight", (hidden,), 1.0)
    w.linear(f"{a}.q_a_proj.weight", q_lora, hidden)
    w.fill(f"{a}.q_a_layernorm.weight", (q_lora,), 1.0)
    # Queries twice the fan-in scale: attention scores of standard deviation ~2 after the
    # 1/sqrt(192) scaling, so a request's attention is peaked enough to depend on its context.
    w.linear(f"{a}.q_b_proj.weight", heads * (nope + rope), q_lora, gain=2.0 * math.sqrt(2.0))
    w.linear(f"{a}.kv_a_proj_with_mqa.weight", kv_lora + rope, hidden)
    w.fill(f"{a}.kv_a_layernorm.weight", (kv_lora,), 1.0)
    w.linear(f"{a}.kv_b_proj.weight", heads * (nope + v), kv_lora)
    w.linear(f"{a}.o_proj.weight", hidden, heads * v, gain=branch_scale)
    m = f"{prefix}.mlp"
    if not moe:
        inter = config["intermediate_size"]
        w.linear(f"{m}.gate_proj.weight", inter, hidden)
        w.linear(f"{m}.up_proj.weight", inter, hidden)
        w.linear(f"{m}.down_proj.weight", hidden, inter, gain=branch_scale)
        return
    inter = config["moe_intermediate_size"]
    experts = config["n_routed_experts"]
    w.linear(f"{m}.gate.weight", experts, hidden)
    w.fill(f"{m}.gate.e_score_correction_bias", (experts,), 0.0, dtype=torch.float32)
    for e in range(experts):
        w.linear(f"{m}.experts.{e}.gate_proj.weight", inter, hidden)
        w.linear(f"{m}.experts.{e}.up_proj.weight", inter, hidden)
        w.linear(f"{m}.experts.{e}.down_proj.weight", hidden, inter, gain=branch_scale)
    shared = inter * config["n_shared_experts"]
    w.linear(f"{m}.shared_experts.gate_proj.weight", shared, hidden)
    w.linear(f"{m}.shared_experts.up_proj.weight", shared, hidden)
    w.linear(f"{m}.shared_experts.down_proj.weight", hidden, shared, gain=branch_scale)


def model_weights(
    config: dict,
    seed: int = 0,
    logit_scale: float = 8.0,
    branch_scale: float = 0.1,
    device: str = "cpu",
) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, by its Hugging Face DeepSeek-V3 name."""
    w = _Weights(seed, device)
    hidden = config["hidden_size"]
    layers = config["num_hidden_layers"]
    vocab = config["vocab_size"]
    w.normal("model.embed_tokens.weight", (vocab, hidden), 1.0)
    for i in range(layers):
        moe = i >= config["first_k_dense_replace"]
        _decoder_layer(w, f"model.layers.{i}", config, moe, branch_scale)
    w.fill("model.norm.weight", (hidden,), 1.0)
    w.linear("lm_head.weight", vocab, hidden, gain=logit_scale)
    # The NextN layer: its decoder is MoE (as DeepSeek-V3's), embed and head are the target's.
    nextn = f"model.layers.{layers}"
    _decoder_layer(w, nextn, config, moe=True, branch_scale=branch_scale)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        w.fill(f"{nextn}.{norm}.weight", (hidden,), 1.0)
    # [identity | 0]: the draft's input is the next token's embedding (see the module doc).
    eh = torch.zeros(hidden, 2 * hidden, dtype=torch.bfloat16, device="meta" if w.meta else "cpu")
    if not w.meta:
        eh[:, :hidden] = torch.eye(hidden, dtype=torch.bfloat16)
    w.tensors[f"{nextn}.eh_proj.weight"] = eh
    return w.tensors


def write_model(
    out: Path,
    preset: str,
    *,
    seed: int = 0,
    layers: int | None = None,
    logit_scale: float = 8.0,
    branch_scale: float = 0.1,
    device: str = "cpu",
    perturb: tuple[int, float] | None = None,
    scale_output: tuple[int, float] | None = None,
) -> dict:
    """Write the model directory; returns its config (with the generator's settings added).
    ``perturb``: (layer, relative size) of a weight fault in one target layer (TEST ONLY).
    ``scale_output``: (layer, S): that target layer's attention output times (1 + S), its
    ``o_proj`` scaled (the reference engine's ``--fault-layer L --fault-scale 1+S``; TEST ONLY)."""
    from safetensors.torch import save_file

    if device == "meta":
        raise ValueError("--device meta draws no weights, so there is nothing to write")
    config = model_config(preset, layers)
    out.mkdir(parents=True, exist_ok=True)
    tensors = model_weights(config, seed, logit_scale, branch_scale, device)
    realized = None
    if perturb is not None:
        tensors, realized = perturbed(tensors, config, *perturb)
    if scale_output is not None:
        layer, size = scale_output
        if not 0 <= layer < config["num_hidden_layers"]:
            raise ValueError(f"scale_output layer {layer} out of range")
        name = f"model.layers.{layer}.self_attn.o_proj.weight"
        tensors[name] = (tensors[name].float() * (1 + size)).to(tensors[name].dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["kdtree_model"] = {
        "preset": preset,
        "name": model_name(preset, layers),
        "seed": seed,
        "logit_scale": logit_scale,
        "branch_scale": branch_scale,
        "parameters": sum(t.numel() for t in tensors.values()),
    }
    if scale_output is not None:
        config["kdtree_model"]["scale_output"] = {"layer": scale_output[0], "size": scale_output[1]}
    if perturb is not None:
        config["kdtree_model"]["perturb"] = {
            "layer": perturb[0],
            "size": perturb[1],
            "realized": realized,
        }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(out, config["max_position_embeddings"])
    return config


def perturbed(
    tensors: dict[str, torch.Tensor], config: dict, layer: int, size: float
) -> tuple[dict[str, torch.Tensor], float]:
    """``tensors`` with layer ``layer``'s matrices perturbed (kdtree_inference.faults), and the
    relative size that survives the bf16 rounding (||W' - W|| / ||W|| over the layer)."""
    from kdtree_inference.faults import perturb_layer

    if not 0 <= layer < config["num_hidden_layers"]:
        raise ValueError(f"--perturb layer {layer} out of range [0, {config['num_hidden_layers']})")
    if not size > 0:
        raise ValueError(f"--perturb size must be positive, got {size}")
    out = perturb_layer(tensors, layer, size)
    changed = [n for n in tensors if out[n] is not tensors[n]]
    diff = sum(float((out[n].float() - tensors[n].float()).norm() ** 2) for n in changed)
    base = sum(float(tensors[n].float().norm() ** 2) for n in changed)
    return out, (diff / base) ** 0.5


def _perturb_arg(text: str) -> tuple[int, float]:
    layer, _, size = text.partition(":")
    try:
        return int(layer), float(size)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYER:SIZE, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="model directory to write")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--layers", type=int, help="target layers (default: the preset's)")
    parser.add_argument("--logit-scale", type=float, default=8.0)
    parser.add_argument("--branch-scale", type=float, default=0.1)
    parser.add_argument(
        "--device", default="cpu", help="where to draw the weights (cuda is faster)"
    )
    parser.add_argument(
        "--perturb",
        type=_perturb_arg,
        metavar="LAYER:SIZE",
        help="TEST ONLY: seeded noise of relative size SIZE in every matrix of layer LAYER",
    )
    args = parser.parse_args(argv)
    try:
        config = write_model(
            args.out,
            args.preset,
            seed=args.seed,
            layers=args.layers,
            logit_scale=args.logit_scale,
            branch_scale=args.branch_scale,
            device=args.device,
            perturb=args.perturb,
        )
    except ValueError as error:
        print(f"make_model: {error}", file=sys.stderr)
        return 2
    made = config["kdtree_model"]
    print(
        f"make_model: {args.preset} seed {args.seed}: {made['parameters'] / 1e6:.1f}M parameters, "
        f"{config['num_hidden_layers']} layers + NextN -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
