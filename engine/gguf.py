"""A GGUF file (llama.cpp's format) as a model source: its config, its weights by HF name, its tokenizer.

Why read GGUF at all: teachers already keep models as GGUF files (ollama, LM Studio, llama.cpp), and
one file holds everything: the shape as metadata, the weights (often quantized in blocks), the
tokenizer and the chat template. The `gguf` library (maintained with llama.cpp) reads the file and
dequantizes its blocks; this module only translates llama.cpp's names and layouts into the HF ones
the loader's name map (engine/loader.py) already speaks, so a GGUF and a safetensors folder take
one path into our Transformer.

Three translations, each the inverse of what llama.cpp's converter did:
  names    `blk.0.attn_q.weight` <- `model.layers.0.self_attn.q_proj.weight`: gguf's own TensorNameMap
           says which HF name became which GGUF name; we ask it about every name our map needs.
  layout   for Llama and OLMo the converter interleaved the halves of each q/k head's rows (its RoPE
           pairs neighbours, HF's pairs halves); `unpermute` undoes it. GPT-2's Conv1D (in, out)
           matrices were stored transposed; we transpose back.
  metadata `llama.embedding_length` 576 -> hidden_size 576, ... (`CONFIG_KEYS`), into the same HF
           config dict a config.json holds, parsed by engine/config.py; Llama 3's rescaled RoPE,
           stored as `rope_freqs` factors, back into HF's `llama3` rule (`llama3_rope`).

Worked example (SmolLM2-135M-Instruct, Q4_1): `blk.0.attn_k.weight` has ne (576, 192), 192 rows of
576 values in Q4_1 blocks of 32 (20 bytes each: a float16 scale, a float16 minimum, 16 bytes of
nibbles), so its data is (192, 360) bytes; dequantized it is (192, 576) float32, and unpermuted over
3 KV heads it is HF's `k_proj.weight`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.config import config_from_hf
from engine.errors import EngineError
from engine.weight_map import weight_specs

# Tensor types a GGUF may hold, and how each is read: F32/F16/BF16 as they are, Q8_0 through
# `q8_0_blocks`, the 4- and 6-bit block types dequantized to float32 (then to the chosen dtype).
ACCEPTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
# llama.cpp architecture -> HF model_type (engine/config.py FAMILIES).
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "olmo": "olmo", "starcoder2": "starcoder2", "gpt2": "gpt2"}
PERMUTED_QK = {"llama", "olmo"}  # llama.cpp's converter interleaves these families' q/k rows
# HF config key -> GGUF metadata key (after `{arch}.`): the keys every family states.
CONFIG_KEYS = {
    "llama": {"hidden_size": "embedding_length", "num_hidden_layers": "block_count", "intermediate_size":
              "feed_forward_length", "num_attention_heads": "attention.head_count", "num_key_value_heads":
              "attention.head_count_kv", "max_position_embeddings": "context_length",
              "rms_norm_eps": "attention.layer_norm_rms_epsilon"},
    "gpt2": {"n_embd": "embedding_length", "n_layer": "block_count", "n_inner": "feed_forward_length",
             "n_head": "attention.head_count", "n_positions": "context_length",
             "layer_norm_epsilon": "attention.layer_norm_epsilon"},
}  # fmt: skip
CONFIG_KEYS["qwen2"] = CONFIG_KEYS["llama"]
CONFIG_KEYS["olmo"] = {k: v for k, v in CONFIG_KEYS["llama"].items() if k != "rms_norm_eps"}  # fixed 1e-5
CONFIG_KEYS["starcoder2"] = {k: v for k, v in CONFIG_KEYS["llama"].items() if k != "rms_norm_eps"} | {
    "norm_epsilon": "attention.layer_norm_epsilon"}  # fmt: skip
GPT2_CONV1D = ("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")


@dataclass(frozen=True)
class GgufModel:
    """What one GGUF file holds, read once: `config` is an HF config.json dict (engine/config.py
    parses it), `tensors` the GGUF tensors by GGUF name, `hf_names` our HF name -> their GGUF name."""

    path: Path
    arch: str
    config: dict
    tensors: dict  # GGUF name -> gguf.ReaderTensor
    hf_names: dict[str, str]
    has_tokenizer: bool  # the file carries a vocabulary (tokenizer.ggml.*)

    def names(self) -> set[str]:
        return set(self.hf_names)

    def get(self, hf_name: str) -> torch.Tensor:
        """The tensor HF calls `hf_name`, dequantized to float32, in HF's layout."""
        gguf_name = self.hf_names[hf_name]
        weights = torch.from_numpy(np.array(dequantize(self.tensors[gguf_name]), dtype=np.float32))  # a copy: the file is mapped read-only
        if self.arch in PERMUTED_QK and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = self.config["num_attention_heads"] if "attn_q" in gguf_name else self.config["num_key_value_heads"]
            weights = unpermute(weights, heads)
        if self.arch == "gpt2" and gguf_name.endswith(GPT2_CONV1D):
            weights = weights.t().contiguous()
        return weights


def unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: within each head, rows (0, 2, 4, ..., 1, 3, 5, ...) back to HF's.

    The converter's permute views a head's D rows as (2, D/2) and transposes to (D/2, 2); the inverse
    views them as (D/2, 2) and transposes back. Example, one head of D = 4: GGUF rows [a0, b0, a1, b1]
    -> HF rows [a0, a1, b0, b1].
    """
    rows = w.shape[0]
    half = rows // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(rows, *w.shape[1:])  # (H, 2, D/2, ...)


def type_name(tensor) -> str:
    return tensor.tensor_type.name


def q8_0_blocks(tensor) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 matrix as (int8 values (rows, cols), float16 scales (rows, cols / 32)).

    Each block of 32 weights is 34 bytes: a float16 scale, then 32 int8 values; weight = value x scale.
    They are our int8 weights' own layout (engine/quant.py): `int8_blocks` hands them over as they are.
    """
    raw = np.asarray(tensor.data, dtype=np.uint8)  # (rows, cols / 32 * 34)
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 34)  # (rows, groups, 34)
    scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0]  # (rows, groups)
    values = blocks[:, :, 2:].copy().view(np.int8).reshape(rows, -1)  # (rows, cols)
    return values, scales


def dequantize(tensor) -> np.ndarray:
    """A tensor's values as a float array in its natural (rows, cols) shape; refused types name themselves."""
    kind = type_name(tensor)
    if kind not in ACCEPTED_TYPES:
        raise EngineError(f"GGUF tensor '{tensor.name}' has type {kind}; accepted types: {', '.join(ACCEPTED_TYPES)}")
    if kind == "Q8_0":
        values, scales = q8_0_blocks(tensor)
        groups = values.reshape(values.shape[0], scales.shape[1], 32)  # (rows, groups, 32)
        return (groups * scales[:, :, None].astype(np.float32)).reshape(values.shape)
    from gguf import dequantize as gguf_dequantize  # lazy: only GGUF sources need the gguf library

    out = gguf_dequantize(tensor.data, tensor.tensor_type)
    return out.astype(np.float32, copy=False) if out.dtype != np.float32 else out


MATRICES = ("wqkv_t", "wo_t", "w_up_t", "w_down_t", "lm_head_t")  # our buffers that int8 stores (engine/quant.py)


def int8_blocks(model: GgufModel, cfg) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Our int8 weights straight from the file's Q8_0 tensors, not dequantized: buffer name -> (q
    (out, in) int8, scale (out, in / 32) float16), for every matrix whose parts are all Q8_0.

    A Q8_0 block is ours bit for bit (32 inputs of one output row, a float16 scale), so the fused
    q|k|v is its three tensors' rows stacked, the q/k rows unpermuted as the floats are. GPT-2's
    matrices were stored transposed (their blocks run along the other axis) and a block holding
    -128 (outside our symmetric range; llama.cpp's quantizer never writes it) is left out: those
    weights are quantized from their dequantized floats like any other source's."""
    if model.arch == "gpt2":
        return {}
    out = {}
    for spec in weight_specs(cfg):
        if not spec.target.endswith(MATRICES) or any(n not in model.hf_names for n, _ in spec.parts):
            continue
        tensors = [model.tensors[model.hf_names[n]] for n, _ in spec.parts]
        if any(type_name(t) != "Q8_0" for t in tensors):
            continue
        parts = []
        for (hf_name, _), tensor in zip(spec.parts, tensors, strict=True):
            values, scales = q8_0_blocks(tensor)
            q, scale = torch.from_numpy(values), torch.from_numpy(scales)  # int8, float16: as the file holds them
            name = model.hf_names[hf_name]
            if model.arch in PERMUTED_QK and name.endswith(("attn_q.weight", "attn_k.weight")):
                heads = model.config["num_attention_heads"] if "attn_q" in name else model.config["num_key_value_heads"]
                q, scale = unpermute(q, heads), unpermute(scale, heads)
            parts.append((q, scale))
        q, scale = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        if int(q.min()) >= -127:
            out[spec.target] = (q.contiguous(), scale.contiguous())
    return out


def read_gguf(path: str | Path) -> GgufModel:
    """Open a GGUF file: check its architecture and every tensor's type, map its metadata and names."""
    path = Path(path)
    try:
        from gguf import GGUFReader  # lazy: the gguf library only for a GGUF source
    except ImportError:  # a declared dependency; a broken install still gets one line
        raise EngineError("reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as err:
        raise EngineError(f"'{path}' is not a readable GGUF file ({' '.join(str(err).split())[:120]})") from None
    meta = {key: _value(field) for key, field in reader.fields.items()}
    arch = str(meta.get("general.architecture"))
    if arch not in ARCHITECTURES:
        raise EngineError(f"GGUF architecture '{arch}' is not supported; supported: {', '.join(ARCHITECTURES)}")
    tensors = {t.name: t for t in reader.tensors}
    refused = sorted({type_name(t) for t in tensors.values()} - set(ACCEPTED_TYPES))
    if refused:
        raise EngineError(f"'{path.name}' holds {', '.join(refused)} tensors; accepted types: {', '.join(ACCEPTED_TYPES)}")
    if meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise EngineError(f"'{path.name}' scales its RoPE by {meta[f'{arch}.rope.scaling.type']}; "
                          "only plain RoPE and Llama 3's rescaled RoPE load")  # fmt: skip
    config = hf_config(meta, arch, set(tensors))
    if "rope_freqs.weight" in tensors:  # Llama 3.1+: the rescaled RoPE, stored as one factor per frequency
        config["rope_scaling"] = llama3_rope(dequantize(tensors["rope_freqs.weight"]), config, path.name)
    return GgufModel(path, arch, config, tensors, _hf_names(config, arch, tensors), "tokenizer.ggml.tokens" in meta)


def gguf_config(path: str | Path) -> dict:
    """The HF config dict of a GGUF file, remembered per file version: the gguf library's reader
    parses every token of the vocabulary (seconds for a 49,152-token one), and a model picker asks often."""
    st = Path(path).stat()
    return _config_of(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _config_of(path: str, mtime_ns: int, size: int) -> dict:
    return read_gguf(path).config


def llama3_rope(factors: np.ndarray, config: dict, file: str) -> dict:
    """Llama 3's RoPE rescaling as HF's config states it, recovered from llama.cpp's `rope_freqs`.

    llama.cpp stores the factor each rotation frequency is divided by; HF's config states the rule
    that made them. Llama 3.1 and 3.2 share the rule's band (factors 1 to 4 over an original context
    of 8,192 tokens) and differ by the largest factor (8 and 32), so the rule is the band and the
    largest factor, and it must reproduce every stored factor, or the file is refused in one line.
    """
    scaling = {"rope_type": "llama3", "factor": float(factors.max()), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    from engine.config import rope_inv_freq  # lazy: it imports torch, as this module does

    cfg = config_from_hf(config | {"rope_scaling": scaling})
    plain = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    implied = (plain / rope_inv_freq(cfg)).numpy()
    if implied.shape != factors.shape or not np.allclose(implied, factors, rtol=1e-4):
        raise EngineError(f"'{file}' rescales its RoPE frequencies (rope_freqs) by a rule other than Llama 3's; "
                          "only plain RoPE and Llama 3's rescaled RoPE load")  # fmt: skip
    return scaling


def hf_config(meta: dict, arch: str, tensor_names: set[str]) -> dict:
    """llama.cpp's metadata as an HF config.json dict: SmolLM2's `llama.embedding_length` 576 is
    `hidden_size` 576, and so on (`CONFIG_KEYS`); what the metadata cannot say, the tensors do."""
    model_type = ARCHITECTURES[arch]
    optional = {f"{arch}.attention.head_count_kv"}  # absent: as many KV heads as query heads
    missing = [f"{arch}.{k}" for k in CONFIG_KEYS[arch].values() if f"{arch}.{k}" not in meta | dict.fromkeys(optional)]
    if missing:
        raise EngineError(f"GGUF metadata lacks '{missing[0]}' that a {arch} model needs")
    config = {hf: meta[f"{arch}.{key}"] for hf, key in CONFIG_KEYS[arch].items() if f"{arch}.{key}" in meta}
    vocab = meta.get(f"{arch}.vocab_size") or meta.get("tokenizer.ggml.tokens")
    if vocab is None:
        raise EngineError("GGUF metadata states no vocabulary size (no vocab_size and no tokenizer.ggml.tokens)")
    config |= {"model_type": model_type, "vocab_size": int(vocab) if not isinstance(vocab, list) else len(vocab),
               "tie_word_embeddings": "output.weight" not in tensor_names}  # fmt: skip
    if arch != "gpt2":
        config["rope_theta"] = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
        heads = config["num_attention_heads"]
        head_dim = meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count")
        config["head_dim"] = int(head_dim or config["hidden_size"] // heads)
        config.setdefault("num_key_value_heads", heads)
        bias = "blk.0.attn_q.bias" in tensor_names
        config |= {"attention_bias": bias} if arch == "llama" else {"use_bias": bias} if arch == "starcoder2" else {}
    if arch == "starcoder2":
        config["hidden_act"] = "gelu_pytorch_tanh"  # llama.cpp's starcoder2 graph: GELU (tanh form)
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    config["eos_token_id"] = list(dict.fromkeys(int(e) for e in eos)) or None
    config["bos_token_id"] = meta.get("tokenizer.ggml.bos_token_id")
    return config


def _hf_names(config: dict, arch: str, tensors: dict) -> dict[str, str]:
    """HF name -> GGUF name for every tensor of the file that has an HF name (gguf's TensorNameMap)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map  # lazy: as above

    gguf_arch = next(a for a, name in MODEL_ARCH_NAMES.items() if name == arch)
    layers = config["n_layer"] if arch == "gpt2" else config["num_hidden_layers"]
    name_map = get_tensor_name_map(gguf_arch, layers)
    cfg = config_from_hf(config)
    prefix = "transformer." if arch == "gpt2" else ""
    out = {}
    for spec in weight_specs(cfg, prefix=prefix):
        for hf_name, _ in spec.parts:
            base, suffix = hf_name.rsplit(".", 1)
            gguf_name = name_map.get_name(base)
            if gguf_name is not None and f"{gguf_name}.{suffix}" in tensors:
                out[hf_name] = f"{gguf_name}.{suffix}"
    return out


def _value(field):
    """A metadata field as a Python value (strings decoded; a long array as its list)."""
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def gguf_tokenizer(model: GgufModel):
    """The file's tokenizer (and chat template) as transformers builds it; None when the file has none."""
    if not model.has_tokenizer:
        return None
    path = model.path
    # lazy: transformers only to build a GGUF's tokenizer. The fast class itself, not AutoTokenizer: that one
    # first reads the file's config, and transformers' GGUF config reader knows fewer families than we serve.
    from transformers import PreTrainedTokenizerFast  # lazy: see above

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, OSError) as err:
        raise EngineError(f"cannot build the tokenizer of '{path.name}': {' '.join(str(err).split())[:160]}") from None


def gguf_codec(model: GgufModel):
    """The engine's TextCodec over the file's tokenizer and chat template (None without a vocabulary)."""
    from engine.text import TextCodec  # lazy: only a file with a vocabulary builds a codec

    tok = gguf_tokenizer(model)
    return TextCodec.from_transformers(tok) if tok is not None else None
