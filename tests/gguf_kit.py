"""Small GGUF files for the tests, written with the `gguf` library's writer the way llama.cpp's
converter writes them: its metadata keys, its tensor names (gguf's TensorNameMap), Llama's and
OLMo's q/k rows interleaved per head, GPT-2's Conv1D matrices transposed, 1-D tensors in F32 and the
matrices in the type asked for (gguf's own quantizers; for Q4_K and Q6_K, which gguf cannot
quantize, valid blocks of random bytes with small scales).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

K_QUANTS = {"Q4_K": (144, 0), "Q6_K": (210, 208)}  # bytes per block of 256, offset of the float16 scale d
ARCH = {"llama": "llama", "qwen2": "qwen2", "olmo": "olmo", "starcoder2": "starcoder2", "gpt2": "gpt2"}
PERMUTED = {"llama", "olmo"}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's rows (D) seen as (2, D/2), stored as (D/2, 2)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(rows: int, cols: int, kind: str, seed: int) -> np.ndarray:
    """(rows, cols / 256 * bytes) of valid `kind` blocks: random quants and sub-scales, small float16 scales."""
    size, d_at = K_QUANTS[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)
    scales = rng.uniform(1e-4, 3e-4, size=(rows, cols // 256, 2 if kind == "Q4_K" else 1)).astype(np.float16)
    blocks[:, :, d_at : d_at + scales.shape[-1] * 2] = scales.view(np.uint8).reshape(rows, cols // 256, -1)
    return blocks.reshape(rows, -1)


def encode_matrix(w: np.ndarray, kind: str, seed: int):
    """(data, raw_dtype) for the writer: float arrays for F32/F16, gguf's blocks for the rest."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "F32":
        return w.astype(np.float32), None
    if kind in K_QUANTS:
        return random_k_blocks(*w.shape, kind, seed), qtype
    return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def write_gguf(model_dir: Path, out: Path, kind: str = "F32", tokenizer: bool = True) -> Path:
    """Write the HF model in `model_dir` (a tests/conftest.py tiny model) as a GGUF file of `kind` matrices."""
    import gguf
    from safetensors.numpy import load_file

    raw = json.loads((model_dir / "config.json").read_text())
    family = raw["model_type"]
    arch = ARCH[family]
    w = gguf.GGUFWriter(str(out), arch)
    gpt2 = family == "gpt2"
    d = raw["n_embd"] if gpt2 else raw["hidden_size"]
    heads = raw["n_head"] if gpt2 else raw["num_attention_heads"]
    kv_heads = heads if gpt2 else raw.get("num_key_value_heads") or heads
    layers = raw["n_layer"] if gpt2 else raw["num_hidden_layers"]
    w.add_block_count(layers)
    w.add_context_length(raw["n_positions"] if gpt2 else raw["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(raw.get("n_inner") or 4 * d if gpt2 else raw["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_vocab_size(raw["vocab_size"])
    if family in ("llama", "qwen2"):
        w.add_layer_norm_rms_eps(raw["rms_norm_eps"])
    else:
        w.add_layer_norm_eps(raw.get("layer_norm_epsilon") or raw.get("norm_epsilon") or 1e-5)
    if not gpt2:
        theta = (raw.get("rope_parameters") or {}).get("rope_theta") or raw.get("rope_theta") or 10000.0
        w.add_rope_freq_base(float(theta))
        w.add_rope_dimension_count(d // heads)
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if scaling.get("rope_type") == "llama3":  # llama.cpp writes the factor each frequency is divided by
        w.add_tensor("rope_freqs.weight", llama3_factors(scaling, d // heads, theta))
    if tokenizer and (model_dir / "tokenizer.json").is_file():
        _add_tokenizer(w, model_dir / "tokenizer.json")
    name_map = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), layers)
    tensors = load_file(str(model_dir / "model.safetensors"))
    for i, (hf_name, t) in enumerate(sorted(tensors.items())):
        base, suffix = hf_name.rsplit(".", 1)
        name = name_map.get_name(base)
        if name is None:  # a buffer HF saves that llama.cpp drops (GPT-2's attention mask)
            continue
        name = f"{name}.{suffix}"
        t = t.astype(np.float32)
        if family in PERMUTED and name.endswith("attn_q.weight"):
            t = permute(t, heads)
        if family in PERMUTED and name.endswith("attn_k.weight"):
            t = permute(t, kv_heads)
        if gpt2 and name.endswith(("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")):
            t = np.ascontiguousarray(t.T)
        data, qtype = encode_matrix(t, kind, i) if t.ndim == 2 else (t, None)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def llama3_factors(s: dict, dim: int, theta: float) -> np.ndarray:
    """llama.cpp's converter: 1 for short wavelengths, `factor` for long ones, a smooth blend between."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen, old = 2 * np.pi / freqs, s["original_max_position_embeddings"]
    low, high, factor = s["low_freq_factor"], s["high_freq_factor"], s["factor"]
    smooth = (old / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, mid)).astype(np.float32)


def _add_tokenizer(w, tokenizer_json: Path) -> None:
    """The tiny byte-level BPE (tests/conftest.py) as llama.cpp spells a GPT-2-style vocabulary."""
    tok = json.loads(tokenizer_json.read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok.get("added_tokens", [])}
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control, 1: normal
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(vocab["<eos>"])
    w.add_bos_token_id(vocab["<eos>"])
    w.add_chat_template(CHAT_TEMPLATE)
