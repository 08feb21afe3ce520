#!/usr/bin/env python3
"""Write a DFlash draft for a ``make_model.py`` target, in the layout SGLang 0.5.23's
``DFlashDraftModel`` (``sglang/srt/models/dflash.py``) loads: ``config.json`` (Qwen3-style, with
``dflash_config``) and ``model.safetensors``. No tokenizer and no embedding or LM head: the
draft borrows the target's embedding and LM head, and the server uses the target's tokenizer.

The target gets a DFlash draft with ``--speculative-algorithm DFLASH
--speculative-draft-model-path OUT --speculative-num-draft-tokens 16``, and the same draft serves
DDTree (``--speculative-algorithm DDTREE``, kdtree's plugin), which takes each block position's
top-k instead of its argmax: since every position's hidden state is the same here (below), each
depth of its tree offers the same candidates, the target's likeliest next tokens after the bonus. Each step, SGLang embeds
the block ``[bonus, mask, ..., mask]`` (``block_size`` tokens; the bonus is the last token the
target chose) with the target's embedding and runs the draft over it: non-causal attention over
the block plus a KV cache of the whole committed context. That cache is written from the target's
hidden states after layer ``target_layer_ids`` (through ``fc``, ``hidden_norm``, ``k_proj`` and
``v_proj``). The draft's last hidden states at block positions 1..T-1 go through the target's LM
head, and the argmaxes are the T-1 draft tokens.

As the NextN draft does (``make_model.py``), this draft predicts what the target would predict
from the bonus token alone. The target's residual branches are small, so where the prefix does
not decide, the target's next token is the argmax of its LM head over the normalised embedding
of the current token. The draft's one layer makes every block position's hidden state a copy of
the bonus token's normalised embedding, built like this:

- ``q_proj`` is 0, so every query attends uniformly to the whole context and block;
- the context's values are 0 (``fc`` is 0);
- ``v_proj`` is the identity with the mask token's embedding direction projected out, so the
  mask positions' values are 0 as well (to bf16 rounding);
- what remains of the average is the bonus's own value, ``1/N`` of its normalised embedding;
- ``o_proj`` (``ATTENTION_GAIN`` = 2^24 times the identity) scales it far above the residual
  (the mask embedding) at any context up to 262k (N <= 2^18);
- the final RMSNorm removes the scale.

The MLP and ``k_proj`` are seeded random weights, so the draft computes as much as a real
one-layer draft. The MLP's output is about 0.1 against a residual of at least 64, so it does not
move the argmax.

Every draft token of the block is therefore the same token: the target's context-free
prediction. The first one is right where the target's prefix does not decide (50-95% of
positions for the tiny model in ``tests/unit/test_bench_models.py``, about 72% at the default
``branch_scale``; not measured on CPU for the larger presets). Later ones are
right only where the target repeats a token. The end-to-end run measures what this means for
the accept length; it is not assumed.

The mask token is id ``vocab_size - 1``, named ``<|kdtree_mask|>`` (a string the tokenizer
lacks, so SGLang takes the explicit id). Prompts should leave it out (``sglang_e2e.py`` does).

Usage: python -m kdtree_bench.models.make_dflash_draft --target TARGET_DIR OUT_DIR [--block-size 16]
       [--seed N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kdtree_bench.models.make_model import _Weights
from kdtree_bench.models.model_names import made_model_name

DRAFT_HEAD_DIM = 128
ATTENTION_GAIN = 2.0**24
MASK_TOKEN = "<|kdtree_mask|>"
BLOCK_SIZE = 16
MLP_DOWN_GAIN = 0.1


def draft_config(target: dict, block_size: int = BLOCK_SIZE) -> dict:
    """config.json of the draft for a target's config.json."""
    hidden = target["hidden_size"]
    layers = target["num_hidden_layers"]
    if hidden % DRAFT_HEAD_DIM:
        raise ValueError(f"the target's hidden size {hidden} is not a multiple of {DRAFT_HEAD_DIM}")
    if layers < 2:
        # The capture point is the input of layer id + 1, which must exist (deepseek_v2.py).
        raise ValueError(f"a DFlash draft needs a target of at least 2 layers, got {layers}")
    if block_size < 2:
        raise ValueError(f"--block-size must be at least 2, got {block_size}")
    heads = hidden // DRAFT_HEAD_DIM
    vocab = target["vocab_size"]
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": DRAFT_HEAD_DIM,
        "intermediate_size": target["intermediate_size"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "max_position_embeddings": target["max_position_embeddings"],
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": block_size,
        "num_target_layers": layers,
        "dflash_config": {
            "block_size": block_size,
            # Output of target layer L-2: SGLang captures the input of layer L-1.
            "target_layer_ids": [layers - 2],
            "mask_token": MASK_TOKEN,
            "mask_token_id": vocab - 1,
        },
    }


def draft_weights(config: dict, mask_embedding: torch.Tensor, seed: int = 0) -> dict:
    """Every tensor of the draft, by the names ``DFlashDraftModel.load_weights`` reads."""
    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    hd = config["head_dim"]
    features = len(config["dflash_config"]["target_layer_ids"])
    w = _Weights(seed, "cpu")
    a, m = "layers.0.self_attn", "layers.0.mlp"
    w.fill("layers.0.input_layernorm.weight", (hidden,), 1.0)
    w.fill("layers.0.post_attention_layernorm.weight", (hidden,), 1.0)
    w.fill(f"{a}.q_proj.weight", (hidden, hidden), 0.0)
    w.linear(f"{a}.k_proj.weight", hidden, hidden)
    # Identity minus the mask direction: the mask positions' values vanish (module doc).
    u = mask_embedding.float() / mask_embedding.float().norm()
    v = torch.eye(hidden) - torch.outer(u, u)
    w.tensors[f"{a}.v_proj.weight"] = v.to(torch.bfloat16)
    w.tensors[f"{a}.o_proj.weight"] = (torch.eye(hidden) * ATTENTION_GAIN).to(torch.bfloat16)
    w.fill(f"{a}.q_norm.weight", (hd,), 1.0)
    w.fill(f"{a}.k_norm.weight", (hd,), 1.0)
    w.linear(f"{m}.gate_proj.weight", inter, hidden)
    w.linear(f"{m}.up_proj.weight", inter, hidden)
    w.linear(f"{m}.down_proj.weight", hidden, inter, gain=MLP_DOWN_GAIN)
    w.fill("norm.weight", (hidden,), 1.0)
    w.fill("fc.weight", (hidden, features * hidden), 0.0)
    w.fill("hidden_norm.weight", (hidden,), 1.0)
    return w.tensors


def mask_embedding_of(target_dir: Path, token: int) -> torch.Tensor:
    """One row of the target's embedding, read without loading the rest."""
    from safetensors import safe_open

    with safe_open(str(target_dir / "model.safetensors"), framework="pt") as f:
        return f.get_slice("model.embed_tokens.weight")[token : token + 1][0]


def write_draft(target_dir: Path, out: Path, block_size: int = BLOCK_SIZE, seed: int = 0) -> dict:
    """Write the draft directory; returns its config (with the generator's settings added)."""
    from safetensors.torch import save_file

    target_file = target_dir / "config.json"
    if not target_file.is_file() or not (target_dir / "model.safetensors").is_file():
        raise ValueError(f"{target_dir} is not a make_model.py model directory")
    target = json.loads(target_file.read_text())
    if target.get("architectures") != ["DeepseekV3ForCausalLM"]:
        raise ValueError(f"{target_dir}: the target must be DeepseekV3ForCausalLM")
    config = draft_config(target, block_size)
    mask = mask_embedding_of(target_dir, config["dflash_config"]["mask_token_id"])
    tensors = draft_weights(config, mask, seed)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["kdtree_model"] = {
        "kind": "dflash-draft",
        "target": made_model_name(target, target_dir.name),
        "target_seed": target.get("kdtree_model", {}).get("seed"),
        "seed": seed,
        "block_size": block_size,
        "attention_gain": ATTENTION_GAIN,
        "parameters": sum(t.numel() for t in tensors.values()),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="draft directory to write")
    parser.add_argument("--target", type=Path, required=True, help="make_model.py target directory")
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--seed", type=int, default=0, help="seed of k_proj and the MLP")
    args = parser.parse_args(argv)
    try:
        config = write_draft(args.target, args.out, args.block_size, args.seed)
    except ValueError as error:
        print(f"make_dflash_draft: {error}", file=sys.stderr)
        return 2
    made = config["kdtree_model"]
    print(
        f"make_dflash_draft: for {made['target']}: block {args.block_size}, target layer "
        f"{config['dflash_config']['target_layer_ids']}, mask id "
        f"{config['dflash_config']['mask_token_id']}, {made['parameters'] / 1e6:.1f}M parameters "
        f"-> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
