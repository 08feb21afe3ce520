"""bench/kdtree_bench/models/make_model.py: the seeded model loads, by name and shape, into transformers'
DeepSeek-V3 (the reference implementation of the checkpoint layout SGLang's loader reads), its
greedy margins are clear, and its context matters without drowning the draft; the kimi-rank
preset is Kimi K2's rank at the same layout. bench/kdtree_bench/models/make_dflash_draft.py: SGLang's DFlash
config parser reads the draft as meant, and the draft's block, computed as SGLang computes it,
is the target's context-free prediction at any context length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kdtree_bench.models import make_dflash_draft, make_model, model_names


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    make_model.write_model(out, "tiny", seed=0)
    return out


@pytest.fixture(scope="module")
def reference(tiny):
    from transformers import DeepseekV3ForCausalLM

    model, info = DeepseekV3ForCausalLM.from_pretrained(
        str(tiny), dtype=torch.float32, output_loading_info=True
    )
    return model.eval(), info


def test_checkpoint_matches_deepseek_v3_by_name_and_shape(tiny, reference) -> None:
    _, info = reference
    config = json.loads((tiny / "config.json").read_text())
    nextn = f"model.layers.{config['num_hidden_layers']}."
    assert info["missing_keys"] == set()
    assert info["mismatched_keys"] == set()
    # Only the NextN (MTP) layer is beyond transformers' model; SGLang's NextN model loads it.
    assert info["unexpected_keys"] and all(k.startswith(nextn) for k in info["unexpected_keys"])
    for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        assert any(k == nextn + name for k in info["unexpected_keys"]), name


def test_greedy_margins_are_clear_and_context_matters(reference) -> None:
    model, _ = reference
    prompts = torch.randint(
        2, make_model.VOCAB, (2, 128), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        logits = model(prompts).logits.float()
        embedded = model.model.embed_tokens(prompts)
        context_free = model.lm_head(
            embedded * torch.rsqrt(embedded.pow(2).mean(-1, keepdim=True) + 1e-6)
        )
    top2 = logits.topk(2, dim=-1).values
    margins = (top2[..., 0] - top2[..., 1]).flatten()
    assert margins.median() > 1.0
    assert (margins < 0.1).float().mean() < 0.1  # near-ties are the exception
    agree = (logits.argmax(-1) == context_free.argmax(-1)).float().mean()
    assert 0.5 < agree < 0.95, agree  # the draft often right, the prefix still deciding


def test_seeds_give_other_weights_and_the_same_seed_the_same(tmp_path) -> None:
    config = make_model.model_config("tiny")
    a = make_model.model_weights(config, seed=3)
    b = make_model.model_weights(config, seed=3)
    c = make_model.model_weights(config, seed=4)
    name = "model.layers.0.self_attn.q_b_proj.weight"
    assert torch.equal(a[name], b[name]) and not torch.equal(a[name], c[name])


def test_tokenizer_round_trips_with_bos_and_eos(tiny) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    text = "the quick brown fox jumps over the lazy dog"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert (tok.bos_token_id, tok.eos_token_id) == (0, 1)


def test_rank_preset_has_deepseek_v3_attention_dims() -> None:
    config = make_model.model_config("rank", layers=6)
    assert (config["hidden_size"], config["q_lora_rank"], config["kv_lora_rank"]) == (
        7168,
        1536,
        512,
    )
    assert config["num_attention_heads"] == 128 // 8
    assert config["num_hidden_layers"] == 6


def test_bad_arguments_are_refused(tmp_path, capsys) -> None:
    assert make_model.main([str(tmp_path / "m"), "--preset", "tiny", "--layers", "0"]) == 2
    assert "--layers must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_model.main([str(tmp_path / "m"), "--preset", "huge"])


def test_kimi_rank_preset_is_one_tp8_rank_of_kimi_k2() -> None:
    config = make_model.model_config("kimi-rank")
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (config["num_attention_heads"], config["hidden_size"]) == (64 // 8, 7168)
    assert (config["q_lora_rank"], config["kv_lora_rank"], config["qk_rope_head_dim"]) == (
        1536,
        512,
        64,
    )
    assert (config["qk_nope_head_dim"], config["v_head_dim"]) == (128, 128)
    assert config["vocab_size"] == 163840 and config["max_position_embeddings"] == 262144
    rope = config["rope_scaling"]
    assert config["rope_theta"] == 50000.0 and rope["type"] == "yarn"
    assert rope["factor"] * rope["original_max_position_embeddings"] == 262144
    assert (rope["beta_fast"], rope["beta_slow"], rope["mscale"], rope["mscale_all_dim"]) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )
    # Per token the MoE computes what a rank computes: 8 routed + 1 shared at 2,048 / 8.
    assert (config["num_experts_per_tok"], config["moe_intermediate_size"]) == (8, 256)
    assert config["n_routed_experts"] == 16 and config["n_shared_experts"] == 1


def test_kimi_rank_checkpoint_has_the_rank_layout_at_kimi_s_shapes() -> None:
    """On the meta device: the 163,840-row embedding and head are never drawn. The names are the
    rank preset's (the layout the tiny checkpoint shows transformers loads); the shapes follow
    8 heads and Kimi's vocabulary."""
    from transformers import DeepseekV3Config

    config = make_model.model_config("kimi-rank")
    kimi = make_model.model_weights(config, device="meta")
    rank = make_model.model_weights(make_model.model_config("rank"), device="meta")
    assert kimi.keys() == rank.keys()
    heads, vocab = 8, 163840
    changed = {
        "model.embed_tokens.weight": (vocab, 7168),
        "lm_head.weight": (vocab, 7168),
    }
    for layer in range(config["num_hidden_layers"] + 1):  # the NextN layer too
        a = f"model.layers.{layer}.self_attn."
        changed[a + "q_b_proj.weight"] = (heads * (128 + 64), 1536)
        changed[a + "kv_b_proj.weight"] = (heads * (128 + 128), 512)
        changed[a + "o_proj.weight"] = (7168, heads * 128)
    for name, tensor in kimi.items():
        assert tuple(tensor.shape) == changed.get(name, tuple(rank[name].shape)), name
    # transformers accepts the YaRN settings and reads them as Kimi's.
    hf_config = DeepseekV3Config(**{k: v for k, v in config.items() if k != "architectures"})
    rope = hf_config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 64.0
    assert rope["rope_theta"] == 50000.0 and rope["original_max_position_embeddings"] == 4096


def test_meta_weights_cannot_be_written(tmp_path, capsys) -> None:
    assert make_model.main([str(tmp_path / "m"), "--preset", "tiny", "--device", "meta"]) == 2
    assert "nothing to write" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------------------------- the DFlash draft


@pytest.fixture(scope="module")
def tiny_draft(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_draft")
    make_dflash_draft.write_draft(tiny, out, block_size=16, seed=0)
    return out


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(
        torch.bfloat16
    )


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding over the last dimension (SGLang's default for the draft)."""
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    a, b = x.float()[..., : dim // 2], x.float()[..., dim // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(torch.bfloat16)


def _mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` as a GPU bf16 GEMM computes it: bf16 inputs, fp32 sums, a bf16 result."""
    return (x.float() @ weight.float().T).to(torch.bfloat16)


def _context_kv(w, config, context_hidden) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft KV of the context, as the DFlash worker writes it from the target's hidden
    states (_append_target_hidden_sequential: fc, hidden_norm, k_proj/v_proj, k_norm, RoPE)."""
    heads, hd = config["num_attention_heads"], config["head_dim"]
    a = "layers.0.self_attn."
    n_ctx = context_hidden.shape[0]
    ctx = _rms(_mm(context_hidden, w["fc.weight"]), w["hidden_norm.weight"])
    k_ctx = _rms(_mm(ctx, w[a + "k_proj.weight"]).view(n_ctx, heads, hd), w[a + "k_norm.weight"])
    k_ctx = _rope(k_ctx, torch.arange(n_ctx), config["rope_theta"])
    return k_ctx, _mm(ctx, w[a + "v_proj.weight"]).view(n_ctx, heads, hd)


def _draft_block_tokens(w, config, embed, lm_head, bonuses, k_ctx, v_ctx) -> torch.Tensor:
    """The draft tokens [B, T-1] of blocks [bonus, mask, ..., mask] as
    sglang/srt/models/dflash.py and the DFlash worker compute them (bf16 GEMMs, fp32 norms): the
    layer, non-causal over the context's KV and the block, the final norm, the target's head,
    and the argmax of block positions 1..T-1."""
    heads, hd = config["num_attention_heads"], config["head_dim"]
    block = config["dflash_config"]["block_size"]
    mask = config["dflash_config"]["mask_token_id"]
    theta = config["rope_theta"]
    a, m = "layers.0.self_attn.", "layers.0.mlp."
    n_ctx, batch = k_ctx.shape[0], bonuses.shape[0]
    ids = torch.full((batch, block), mask)
    ids[:, 0] = bonuses
    hidden = embed[ids.flatten()]
    positions = torch.arange(n_ctx, n_ctx + block).repeat(batch)
    x = _rms(hidden, w["layers.0.input_layernorm.weight"])
    q = _rms(_mm(x, w[a + "q_proj.weight"]).view(-1, heads, hd), w[a + "q_norm.weight"])
    k = _rms(_mm(x, w[a + "k_proj.weight"]).view(-1, heads, hd), w[a + "k_norm.weight"])
    q, k = _rope(q, positions, theta), _rope(k, positions, theta)
    v = _mm(x, w[a + "v_proj.weight"]).view(batch, block, heads, hd)
    q, k = q.view(batch, block, heads, hd).float(), k.view(batch, block, heads, hd).float()
    ctx_scores = torch.einsum("bqhd,khd->bhqk", q, k_ctx.float())
    own_scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
    probs = (torch.cat([ctx_scores, own_scores], -1) / hd**0.5).softmax(-1)
    attn = torch.einsum("bhqk,khd->bqhd", probs[..., :n_ctx], v_ctx.float())
    attn = attn + torch.einsum("bhqk,bkhd->bqhd", probs[..., n_ctx:], v.float())
    out = _mm(attn.to(torch.bfloat16).reshape(batch * block, heads * hd), w[a + "o_proj.weight"])
    residual = (hidden.float() + out.float()).to(torch.bfloat16)
    h = _rms(residual, w["layers.0.post_attention_layernorm.weight"])
    gate = torch.nn.functional.silu(_mm(h, w[m + "gate_proj.weight"]).float())
    mlp = _mm(
        (gate * _mm(h, w[m + "up_proj.weight"]).float()).to(torch.bfloat16),
        w[m + "down_proj.weight"],
    )
    final = _rms(mlp.float() + residual.float(), w["norm.weight"]).view(batch, block, -1)
    return (final[:, 1:].float() @ lm_head.float().T).argmax(-1)


def test_draft_config_is_what_sglang_s_dflash_reads(tiny, tiny_draft) -> None:
    config = json.loads((tiny_draft / "config.json").read_text())
    target = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]  # not remapped to NextN
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    parsed = parse_dflash_draft_config(draft_hf_config=config)
    assert parsed.block_size == 16 and parsed.mask_token_id == target["vocab_size"] - 1
    layers = target["num_hidden_layers"]
    ids = parsed.resolve_target_layer_ids(target_num_layers=layers, draft_num_layers=1)
    # SGLang captures the input of layer id + 1 (deepseek_v2.py), which must exist.
    assert ids == [layers - 2] and ids[0] + 1 < layers
    assert config["num_attention_heads"] * config["head_dim"] == target["hidden_size"]


def test_draft_weights_have_dflash_s_names_and_shapes(tiny_draft) -> None:
    from safetensors.torch import load_file

    config = json.loads((tiny_draft / "config.json").read_text())
    h, inter, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    w = load_file(str(tiny_draft / "model.safetensors"))
    a, m = "layers.0.self_attn.", "layers.0.mlp."
    expected = {
        "layers.0.input_layernorm.weight": (h,),
        "layers.0.post_attention_layernorm.weight": (h,),
        a + "q_proj.weight": (h, h),
        a + "k_proj.weight": (h, h),
        a + "v_proj.weight": (h, h),
        a + "o_proj.weight": (h, h),
        a + "q_norm.weight": (hd,),
        a + "k_norm.weight": (hd,),
        m + "gate_proj.weight": (inter, h),
        m + "up_proj.weight": (inter, h),
        m + "down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "fc.weight": (h, h),
        "hidden_norm.weight": (h,),
    }
    assert {n: tuple(t.shape) for n, t in w.items()} == expected
    assert not any("embed" in n or "lm_head" in n for n in w)  # borrowed from the target


def test_draft_predicts_the_target_s_context_free_token_at_any_context(
    tiny, tiny_draft, reference
) -> None:
    from safetensors.torch import load_file

    model, _ = reference
    config = json.loads((tiny_draft / "config.json").read_text())
    w = load_file(str(tiny_draft / "model.safetensors"))
    target = load_file(str(tiny / "model.safetensors"))
    embed, lm_head = target["model.embed_tokens.weight"], target["lm_head.weight"]
    g = torch.Generator().manual_seed(1)
    bonuses = torch.randint(2, config["vocab_size"] - 1, (24,), generator=g)
    normed = _rms(embed[bonuses], torch.ones(embed.shape[1]))
    context_free = (normed @ lm_head.T).float().argmax(-1)
    hidden = config["hidden_size"]
    for n_ctx in (0, 1000, 16384):
        context = torch.randn(n_ctx, hidden, generator=g).to(torch.bfloat16)
        k_ctx, v_ctx = _context_kv(w, config, context)
        tokens = _draft_block_tokens(w, config, embed, lm_head, bonuses, k_ctx, v_ctx)
        follows = (tokens == context_free[:, None]).all(-1).sum()
        assert follows >= 22, (n_ctx, follows)  # every block token is the bonus's prediction
    # And that prediction is the target's own next token where the prefix does not decide.
    prompts = torch.randint(2, config["vocab_size"] - 1, (2, 96), generator=g)
    with torch.no_grad():
        target_next = model(prompts).logits.argmax(-1)
    k_ctx, v_ctx = _context_kv(w, config, torch.zeros(0, hidden, dtype=torch.bfloat16))
    first = _draft_block_tokens(w, config, embed, lm_head, prompts.flatten(), k_ctx, v_ctx)
    agree = (first[:, 0].view_as(prompts) == target_next).float().mean()
    assert 0.5 < agree < 0.95, agree


def test_draft_writer_refuses_what_it_cannot_serve(tmp_path, capsys) -> None:
    assert make_dflash_draft.main([str(tmp_path / "d"), "--target", str(tmp_path)]) == 2
    assert "is not a make_model.py model directory" in capsys.readouterr().err
    target = make_model.model_config("tiny", layers=1)
    with pytest.raises(ValueError, match="at least 2 layers"):
        make_dflash_draft.draft_config(target)
    with pytest.raises(ValueError, match="--block-size must be at least 2"):
        make_dflash_draft.draft_config(make_model.model_config("tiny"), block_size=1)
    kimi = make_dflash_draft.draft_config(make_model.model_config("kimi-rank"))
    assert kimi["dflash_config"]["mask_token_id"] == 163839 and kimi["num_attention_heads"] == 56


def test_sglang_reads_kimi_rank_and_its_draft_as_meant(tmp_path) -> None:
    """SGLang's own ModelConfig (what its server builds from --model-path and
    --speculative-draft-model-path) on the two config.json files."""
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.utils.hf_transformers_utils import get_rope_config

    target_dir, draft_dir = tmp_path / "target", tmp_path / "draft"
    target_dir.mkdir()
    draft_dir.mkdir()
    config = make_model.model_config("kimi-rank")
    (target_dir / "config.json").write_text(json.dumps(config))
    (draft_dir / "config.json").write_text(json.dumps(make_dflash_draft.draft_config(config)))
    target = ModelConfig(str(target_dir), trust_remote_code=False, dtype="bfloat16")
    assert target.attention_arch == AttentionArch.MLA
    assert (target.context_len, target.vocab_size) == (262144, 163840)
    theta, scaling = get_rope_config(target.hf_config)
    assert theta == 50000.0 and scaling["factor"] == 64.0 and scaling["rope_type"] == "yarn"
    draft = ModelConfig(
        str(draft_dir),
        trust_remote_code=False,
        dtype="bfloat16",
        is_draft_model=True,
        speculative_algorithm="DFLASH",
    )
    # Not remapped to DeepseekV3ForCausalLMNextN, and an MHA draft with its own KV.
    assert draft.hf_config.architectures == ["DFlashDraftModel"]
    assert draft.attention_arch == AttentionArch.MHA
    assert (draft.head_dim, draft.v_head_dim, draft.get_num_kv_heads(1)) == (128, 128, 56)
    assert (draft.context_len, draft.vocab_size) == (262144, 163840)


def test_perturb_writes_one_layer_moved_by_the_relative_size(tmp_path, tiny) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "perturbed"
    config = make_model.write_model(out, "tiny", seed=0, perturb=(1, 0.02))
    stock, moved = (
        load_file(str(tiny / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    changed = {n for n in stock if not torch.equal(stock[n], moved[n])}
    assert changed and all(n.startswith("model.layers.1.") for n in changed)
    assert config["kdtree_model"]["perturb"]["realized"] == pytest.approx(0.02, rel=0.05)
    # Far below bf16's step, most of the noise rounds away: the realized size says so.
    small = make_model.perturbed(
        make_model.model_weights(make_model.model_config("tiny"), 0),
        make_model.model_config("tiny"),
        0,
        1e-4,
    )[1]
    assert small < 0.5e-4
    assert make_model.main([str(tmp_path / "m"), "--perturb", "9:0.1"]) == 2


def test_scale_output_scales_one_layers_o_proj(tmp_path, tiny) -> None:
    """The SGLang counterpart of the reference engine's --fault-layer/--fault-scale."""
    from safetensors.torch import load_file

    out = tmp_path / "scaled"
    config = make_model.write_model(out, "tiny", seed=0, scale_output=(1, 0.02))
    stock, moved = (
        load_file(str(tiny / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    name = "model.layers.1.self_attn.o_proj.weight"
    assert {n for n in stock if not torch.equal(stock[n], moved[n])} == {name}
    ratio = moved[name].float().norm() / stock[name].float().norm()
    assert float(ratio) == pytest.approx(1.02, rel=2e-3)
    assert config["kdtree_model"]["scale_output"] == {"layer": 1, "size": 0.02}


def test_a_model_of_another_depth_is_named_by_it(tmp_path, tiny, tiny_draft) -> None:
    """Records key rows by model name, so a preset at another layer count gets its own name,
    which its DFlash draft and sglang_e2e's records carry."""
    assert json.loads((tiny / "config.json").read_text())["kdtree_model"]["name"] == "tiny"
    assert json.loads((tiny_draft / "config.json").read_text())["kdtree_model"]["target"] == "tiny"
    assert make_model.model_name("rank", 4) == "rank"
    deep = tmp_path / "deep"
    config = make_model.write_model(deep, "tiny", seed=0, layers=3)
    assert config["num_hidden_layers"] == 3
    assert config["kdtree_model"]["name"] == "tiny-3-layers"
    assert model_names.made_model_name(config, "dir") == "tiny-3-layers"
    assert model_names.made_model_name({"kdtree_model": {"preset": "rank"}}, "dir") == "rank"
    assert model_names.made_model_name({}, "dir") == "dir"
    draft = make_dflash_draft.write_draft(deep, tmp_path / "draft", block_size=16, seed=0)
    assert draft["kdtree_model"]["target"] == "tiny-3-layers"
