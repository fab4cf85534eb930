"""Our Transformer's buffers named in HF's tensor names: the explicit map every checkpoint is loaded through.

Why a hand-written name map instead of `from_pretrained`: the learner can see exactly which HF
tensor lands where, and how it is reshaped on the way (q/k/v fused, weights pre-transposed). Both
sources the loader reads speak these HF names: a safetensors folder as it is, a GGUF file through
engine/gguf.py's translation of llama.cpp's names.

Worked example (SmolLM2-135M, layer 0): `model.layers.0.self_attn.{q,k,v}_proj.weight` are
(576, 576), (192, 576) and (192, 576); stacked they are (960, 576), transposed they fill our
`layers.0.attn.wqkv_t` of shape (576, 960). GPT-2's `Conv1D` already stores `(in, out)`, so its
`c_attn.weight` (768, 2304) is copied as is.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig, family_of


@dataclass(frozen=True)
class WeightSpec:
    """Our buffer `target` = cat(HF tensors `parts`, dim 0), transposed when `transpose`."""

    target: str
    parts: list[tuple[str, tuple[int, ...]]]  # (HF name, expected HF shape)
    transpose: bool = True


def llama_weight_map(cfg: ModelConfig) -> list[WeightSpec]:
    """Llama-spelled checkpoints (Llama / SmolLM2 / Mistral, Qwen2, StarCoder2): the family entry
    (engine/config.py `FAMILIES`) names what differs. HF nn.Linear stores (out, in)."""
    fam = family_of(cfg)
    d, q, kv, f = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    # A norm's tensors; none for a LayerNorm without parameters (load_weights sets them to 1 and 0).
    norm_parts = () if not cfg.norm_affine else ("weight", "bias") if cfg.norm == "layer" else ("weight",)
    specs = []
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        a, m = hf + "self_attn.", hf + "mlp."
        for norm, name in (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")):
            specs += [WeightSpec(f"{ours}{norm}.{p}", [(f"{hf}{name}.{p}", (d,))], False) for p in norm_parts]
        qkv = [(a + "q_proj", q), (a + "k_proj", kv), (a + "v_proj", kv)]
        specs += [
            WeightSpec(ours + "attn.wqkv_t", [(n + ".weight", (rows, d)) for n, rows in qkv]),
            WeightSpec(ours + "attn.wo_t", [(a + "o_proj.weight", (d, q))]),
            WeightSpec(ours + "mlp.w_up_t", [(f"{m}{n}.weight", (f, d)) for n in fam.up]),  # gate, up fused
            WeightSpec(ours + "mlp.w_down_t", [(f"{m}{fam.down}.weight", (d, f))]),
        ]
        if cfg.qkv_bias:
            specs.append(WeightSpec(ours + "attn.bqkv", [(n + ".bias", (rows,)) for n, rows in qkv], False))
        if cfg.out_bias:
            specs += [WeightSpec(ours + "attn.bo", [(a + "o_proj.bias", (d,))], False),
                      WeightSpec(ours + "mlp.b_up", [(f"{m}{n}.bias", (f,)) for n in fam.up], False),
                      WeightSpec(ours + "mlp.b_down", [(f"{m}{fam.down}.bias", (d,))], False)]  # fmt: skip
    specs += [WeightSpec(f"final_norm.{p}", [(f"model.norm.{p}", (d,))], False) for p in norm_parts]
    embed = ("model.embed_tokens.weight", (cfg.vocab_size, d))
    if cfg.tied:
        specs.append(WeightSpec("lm_head_t", [embed]))
    else:
        specs += [WeightSpec("embed", [embed], False),
                  WeightSpec("lm_head_t", [("lm_head.weight", (cfg.vocab_size, d))])]  # fmt: skip
    return specs


def gpt2_weight_map(cfg: ModelConfig, prefix: str) -> list[WeightSpec]:
    """GPT-2 names (`prefix` is "transformer." for GPT2LMHeadModel files, "" for old hub files)."""
    d, f = cfg.d_model, cfg.ffn_dim
    specs = []
    for i in range(cfg.n_layers):
        hf, ours = f"{prefix}h.{i}.", f"layers.{i}."
        for norm, ln in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            specs += [
                WeightSpec(f"{ours}{norm}.{p}", [(f"{hf}{ln}.{p}", (d,))], False) for p in ("weight", "bias")
            ]
        conv1d = [  # Conv1D weights are already (in, out)
            ("attn.wqkv_t", "attn.c_attn.weight", (d, 3 * d)), ("attn.bqkv", "attn.c_attn.bias", (3 * d,)),
            ("attn.wo_t", "attn.c_proj.weight", (d, d)), ("attn.bo", "attn.c_proj.bias", (d,)),
            ("mlp.w_up_t", "mlp.c_fc.weight", (d, f)), ("mlp.b_up", "mlp.c_fc.bias", (f,)),
            ("mlp.w_down_t", "mlp.c_proj.weight", (f, d)), ("mlp.b_down", "mlp.c_proj.bias", (d,)),
        ]  # fmt: skip
        specs += [WeightSpec(ours + t, [(hf + n, s)], False) for t, n, s in conv1d]
    specs += [WeightSpec(f"final_norm.{p}", [(f"{prefix}ln_f.{p}", (d,))], False) for p in ("weight", "bias")]
    specs.append(WeightSpec("wpe", [(f"{prefix}wpe.weight", (cfg.max_context, d))], False))
    wte = (f"{prefix}wte.weight", (cfg.vocab_size, d))
    if cfg.tied:
        specs.append(WeightSpec("lm_head_t", [wte]))
    else:
        specs += [WeightSpec("embed", [wte], False),
                  WeightSpec("lm_head_t", [("lm_head.weight", (cfg.vocab_size, d))])]  # fmt: skip
    return specs


def weight_specs(cfg: ModelConfig, prefix: str = "") -> list[WeightSpec]:
    """The name map of `cfg`'s family; `prefix` is GPT-2's "transformer." where its file spells it."""
    return gpt2_weight_map(cfg, prefix) if cfg.family == "gpt2" else llama_weight_map(cfg)
