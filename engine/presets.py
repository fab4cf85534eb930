"""Real architectures with random weights, built locally: timings are real, the text is noise.

Why presets: the shape of a model (layers, width, heads, vocabulary) alone decides how long prefill
and decode take, so the lab can show "what would SmolLM2 / Qwen2.5 / Llama-3.2 cost on this
machine" without downloading gigabytes. Each preset is the model's HF config.json, copied by hand.
Weights are drawn N(0, 0.02) from a seeded generator (norms 1, biases 0), so two loads are
identical. `ModelInfo.trained` is False so the UI can say so.

Memory is checked BEFORE building: Llama-3.2-1B in float32 needs ~4.9 GB of weights, and a machine
with less free memory gets one line saying so instead of an out-of-memory kill.

Simplification: `llama-3.2-1b` uses plain RoPE (theta 500,000) without Llama 3's frequency scaling;
it changes no timing. Text prompts use the chef's tokenizer when `engine/models/chef` exists; ids
the tokenizer does not know decode as a ⟨id⟩ placeholder. Token-id prompts always work.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import config_from_hf
from engine.errors import EngineError
from engine.limits import available_memory
from engine.model import Transformer
from engine.text import TextCodec

CHEF_DIR = Path(__file__).resolve().parent / "models" / "chef"
INIT_STD = 0.02
SEED = 1234

PRESETS: dict[str, dict] = {
    "smollm2-135m": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152,
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu",
        "bos_token_id": 0, "eos_token_id": 0,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu", "use_sliding_window": False,
        "bos_token_id": 151643, "eos_token_id": 151643,
    },
    "llama-3.2-1b": {  # plain RoPE: Llama 3's rope_scaling left out on purpose (see module docstring)
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu",
        "bos_token_id": 128000, "eos_token_id": 128001,
    },
}  # fmt: skip


def preset_config(name: str):
    if name not in PRESETS:
        raise EngineError(f"unknown preset '{name}' (available: {', '.join('preset:' + p for p in PRESETS)})")
    return config_from_hf(PRESETS[name])


def bytes_needed(name: str, dtype: torch.dtype) -> int:
    """Weights (tied embeddings stored once) plus the RoPE tables, in bytes."""
    cfg = preset_config(name)
    rope = 2 * cfg.max_context * cfg.head_dim if cfg.positions == "rope" else 0
    return (cfg.num_params() + rope) * dtype.itemsize


# Weights may take at most this share of the memory that is free when they are built: the rest is
# left for the KV cache, activations and everything else on the machine.
USABLE_FRACTION = 0.9


def check_fits(name: str, device: torch.device, dtype: torch.dtype) -> None:
    need, free = bytes_needed(name, dtype), available_memory(device)
    if need > USABLE_FRACTION * free:
        dt = str(dtype).removeprefix("torch.")
        raise EngineError(
            f"preset:{name} needs {need / 1e9:.2f} GB for its {dt} weights but only {free / 1e9:.2f} GB "
            f"is available on {device}; try bfloat16 or a smaller preset"
        )


def fill_random(model: Transformer, seed: int = SEED) -> None:
    """Norm weights 1, biases 0, everything else N(0, 0.02), drawn on the CPU so every device agrees."""
    gen = torch.Generator().manual_seed(seed)
    for name, buf in model.named_buffers():
        if name.startswith("rope_"):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name and leaf == "weight":
            buf.fill_(1.0)
        elif leaf.startswith("b"):  # bqkv, bo, b_up, b_down, norm biases
            buf.zero_()
        else:
            buf.copy_(torch.randn(buf.shape, generator=gen).mul_(INIT_STD))  # one temporary, not two


def chef_codec():

    return TextCodec.from_folder(CHEF_DIR) if CHEF_DIR.is_dir() else None


def build_preset(name: str, device: torch.device, dtype: torch.dtype):
    """-> (Transformer with random weights, TextCodec | None)."""
    cfg = preset_config(name)
    check_fits(name, device, dtype)
    model = Transformer(cfg, device=device, dtype=dtype)
    fill_random(model)
    return model, chef_codec()
