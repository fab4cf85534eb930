"""`ModelConfig`: the handful of numbers that decide a transformer's shape, read from HF config.json.

Why our own dataclass instead of `transformers.PretrainedConfig`: the engine only needs ~20 fields,
and naming them once here (d_model, n_kv_heads, ffn_dim, ...) lets every other file -- the model,
the cost model, the lab's theory lines -- read the same numbers without knowing three families'
spellings (`hidden_size` vs `n_embd`, `num_key_value_heads` vs nothing at all).

Worked example: SmolLM2-135M's config.json has hidden_size 576, 30 layers, 9 heads of which 3 are
KV heads, so head_dim = 576 / 9 = 64 and each token's KV cache costs
2 (K and V) x 30 layers x 3 heads x 64 x 4 bytes = 46,080 bytes in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import EngineError

ACTIVATIONS = {"silu", "gelu", "gelu_new", "gelu_pytorch_tanh"}


@dataclass(frozen=True)
class Family:
    """How one HF `model_type` with Llama's config spelling maps onto our one Transformer: its
    layer's options and the names of the tensors that differ from Llama's.

    A family that differs from Llama by its norm or its MLP is one entry here (and its parity test
    against `transformers`). Examples: StarCoder2 is a Llama with LayerNorm (with bias), an ungated
    `c_fc -> gelu -> c_proj` MLP and a bias on every projection (`use_bias`); OLMo is a Llama whose
    norms are LayerNorms without parameters.
    """

    name: str  # what `ModelConfig.family` and the model card say
    norm: str = "rms"  # "rms" or "layer" (LayerNorm with bias)
    norm_affine: bool = True  # False: a LayerNorm with no weight or bias (OLMo); the engine uses 1 and 0
    eps_key: str = "rms_norm_eps"  # config.json's name for the norm's epsilon
    norm_eps: float | None = None  # a fixed epsilon the config does not carry (OLMo's 1e-5)
    mlp_gated: bool = True  # SwiGLU (gate * up) or plain up -> act -> down
    up: tuple[str, ...] = ("gate_proj", "up_proj")  # the MLP's input matrices, fused in this order
    down: str = "down_proj"
    qkv_bias: str | bool = "attention_bias"  # True, or the config key that says so
    out_bias: str | bool = False  # a bias on the attention output and the MLP (True or a config key)
    window: bool = False  # honours `sliding_window` (Mistral): the context stops at the window
    tied: bool = False  # whether the LM head shares the embedding when config.json does not say

    def flag(self, value: str | bool, raw: dict) -> bool:
        return bool(raw.get(value, False)) if isinstance(value, str) else value


# model_type -> family (GPT-2's own config spelling and Conv1D weights are read by `_gpt2_config`).
FAMILIES = {
    "llama": Family("llama", window=True),
    "mistral": Family("llama", window=True),  # a Llama with (optionally) sliding-window attention
    "qwen2": Family("qwen2", qkv_bias=True),
    "olmo": Family("olmo", norm="layer", norm_affine=False, norm_eps=1e-5),  # norms without parameters
    "starcoder2": Family("starcoder2", norm="layer", eps_key="norm_epsilon", mlp_gated=False, up=("c_fc",),
                         down="c_proj", qkv_bias="use_bias", out_bias="use_bias", window=True, tied=True),  # fmt: skip
    "gpt2": Family("gpt2", norm="layer"),
}


@dataclass(frozen=True)
class ModelConfig:
    family: str  # a `Family.name`: "llama", "qwen2", "starcoder2", "gpt2"
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    max_context: int
    norm: str = "rms"  # "rms" (Llama, Qwen2) or "layer" (GPT-2, with bias; OLMo, without parameters)
    norm_affine: bool = True  # the checkpoint holds the norms' weights (and a LayerNorm's bias)
    norm_eps: float = 1e-5
    positions: str = "rope"  # "rope" or "learned" (GPT-2's wpe table)
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # only Llama-3's "llama3" frequency scaling is supported
    tied: bool = True  # LM head shares the embedding matrix
    qkv_bias: bool = False  # Qwen2 and GPT-2 add a bias to q/k/v
    out_bias: bool = False  # GPT-2: bias on the attention output and the MLP projections
    mlp_gated: bool = True  # SwiGLU (gate * up) vs GPT-2's plain fc -> act -> proj
    act: str = "silu"
    eos_ids: tuple[int, ...] = field(default_factory=tuple)
    bos_id: int | None = None

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads that share one KV head (GQA). 1 = plain multi-head attention."""
        return self.n_heads // self.n_kv_heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V, every layer, every KV head: what one cached token costs."""
        return 2 * self.n_layers * self.kv_dim * dtype_bytes

    def layer_matmul_params(self) -> int:
        """Weights one layer multiplies each token by (q/k/v, out, MLP). Used by costs.py too."""
        attn = self.d_model * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.d_model
        mlp = (3 if self.mlp_gated else 2) * self.d_model * self.ffn_dim
        return attn + mlp

    def num_params(self) -> int:
        """Parameter count, tied embeddings counted once (the number model cards quote).

        SmolLM2-135M: 30 x 3,538,944 matmul weights + 49,152 x 576 embedding + 61 norms x 576
        = 134,515,008.
        """
        d = self.d_model
        norm_params = 0 if not self.norm_affine else d if self.norm == "rms" else 2 * d
        per_layer = self.layer_matmul_params() + 2 * norm_params
        if self.qkv_bias:
            per_layer += self.q_dim + 2 * self.kv_dim
        if self.out_bias:
            per_layer += d + (self.ffn_dim + d)  # attn out bias, MLP fc and proj biases
        total = self.n_layers * per_layer + norm_params + self.vocab_size * d
        if not self.tied:
            total += self.vocab_size * d
        if self.positions == "learned":
            total += self.max_context * d
        return total


def family_of(cfg: ModelConfig) -> Family:
    """The family entry a parsed config came from (the loader reads its tensor names)."""
    return next(f for f in FAMILIES.values() if f.name == cfg.family)


def _eos_ids(raw: dict) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))


def _rope_params(raw: dict) -> dict:
    """transformers 5 writes `rope_parameters`; older config.json files use rope_theta + rope_scaling."""
    params = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    return params


def _check_rope_scaling(raw: dict) -> dict | None:
    scaling = _rope_params(raw)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise EngineError(f"unsupported rope_scaling type '{kind}' (supported: default, llama3)")
    return dict(scaling)


def config_from_hf(raw: dict) -> ModelConfig:
    """Parse an HF config.json dict of a family in FAMILIES (Llama, SmolLM2, Mistral, Qwen2, OLMo, GPT-2)."""
    try:
        return _parse(raw)
    except KeyError as err:
        raise EngineError(
            f"config.json lacks the field {err} that a {raw.get('model_type')} model needs"
        ) from None
    except (TypeError, ValueError) as err:
        raise EngineError(f"config.json has an invalid value: {err}") from None


def _parse(raw: dict) -> ModelConfig:
    model_type = raw.get("model_type")
    family = FAMILIES.get(str(model_type))
    if family is None:
        arch = ", ".join(raw.get("architectures") or []) or "unknown architecture"
        raise EngineError(
            f"unsupported architecture '{model_type}' ({arch}); supported: {', '.join(FAMILIES)}"
        )
    if raw.get("clip_qkv") is not None:
        raise EngineError("unsupported option 'clip_qkv' (q/k/v clipped to a range)")
    if family.name == "gpt2":
        return _gpt2_config(raw)
    d, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    act = raw.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise EngineError(f"unsupported activation '{act}' (supported: {', '.join(sorted(ACTIVATIONS))})")
    if raw.get("mlp_bias"):
        raise EngineError("unsupported option 'mlp_bias' (MLP projections with bias)")
    max_ctx = int(raw.get("max_position_embeddings", 2048))
    window = raw.get("sliding_window") if raw.get("use_sliding_window", family.window) else None
    if window:
        # Attention is exact as long as no query looks further back than the window.
        max_ctx = min(max_ctx, int(window))
    return ModelConfig(
        family=family.name,
        vocab_size=int(raw["vocab_size"]),
        d_model=d,
        n_layers=int(raw["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or d // heads),
        ffn_dim=int(raw["intermediate_size"]),
        max_context=max_ctx,
        norm=family.norm,
        norm_affine=family.norm_affine,
        norm_eps=family.norm_eps if family.norm_eps is not None else float(raw.get(family.eps_key, 1e-6)),
        positions="rope",
        rope_theta=float(_rope_params(raw)["rope_theta"]),
        rope_scaling=_check_rope_scaling(raw),
        tied=bool(raw.get("tie_word_embeddings", family.tied)),
        qkv_bias=family.flag(family.qkv_bias, raw),
        out_bias=family.flag(family.out_bias, raw),
        mlp_gated=family.mlp_gated,
        act=act,
        eos_ids=_eos_ids(raw),
        bos_id=raw.get("bos_token_id"),
    )


def _gpt2_config(raw: dict) -> ModelConfig:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if raw.get(flag):
            raise EngineError(f"unsupported GPT-2 option '{flag}'")
    d, heads = int(raw["n_embd"]), int(raw["n_head"])
    act = raw.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise EngineError(f"unsupported activation '{act}' (supported: {', '.join(sorted(ACTIVATIONS))})")
    return ModelConfig(
        family="gpt2",
        vocab_size=int(raw["vocab_size"]),
        d_model=d,
        n_layers=int(raw["n_layer"]),
        n_heads=heads,
        n_kv_heads=heads,
        head_dim=d // heads,
        ffn_dim=int(raw.get("n_inner") or 4 * d),
        max_context=int(raw.get("n_positions", 1024)),
        norm="layer",
        norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
        positions="learned",
        tied=bool(raw.get("tie_word_embeddings", True)),
        qkv_bias=True,
        out_bias=True,
        mlp_gated=False,
        act=act,
        eos_ids=_eos_ids(raw),
        bos_id=raw.get("bos_token_id"),
    )


def rope_inv_freq(cfg: ModelConfig):
    """Rotation speed of each pair of head dims: theta^(-2i/D), optionally Llama-3-rescaled.

    Llama 3 slows down the low-frequency pairs by `factor` so the model reaches a longer context;
    high-frequency pairs are left alone and the band between is blended smoothly.
    """
    import torch  # lazy: reading a config (the app's model picker, limits) does not load torch

    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = cfg.rope_scaling
    if not s:
        return inv
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, blended, scaled)
