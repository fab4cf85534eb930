"""Find a model's files and copy its weights into our Transformer, through an explicit name map.

The map (engine/weight_map.py) names every buffer's HF tensors; the weights come from a tensor
source that answers to HF names: a safetensors folder (`SafetensorsFolder`) or a GGUF file
(engine/gguf.py). Each tensor's shape is checked against the config before it is copied, so a
mismatched checkpoint fails with one line naming the tensor, not with a matmul error three layers
later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import ModelConfig, config_from_hf
from engine.errors import EngineError
from engine.model import Transformer
from engine.presets import build_preset
from engine.quant import parse_quant, quantize
from engine.text import TextCodec
from engine.weight_map import weight_specs

HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                "merges.txt", "tokenizer.model"]  # fmt: skip


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise EngineError(f"no config.json in '{folder}': not a Hugging Face model folder")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise EngineError(f"cannot read '{path}': {err}") from None
    return config_from_hf(raw)


class SafetensorsFolder:
    """A folder's *.safetensors as a tensor source: HF name -> tensor (sharded checkpoints included).
    A GGUF file is the other source (engine/gguf.py `GgufModel`): both answer `names()` and `get()`."""

    def __init__(self, folder: Path):
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise EngineError(f"no *.safetensors weights in '{folder}' (only safetensors files are loaded)")
        self.where, self.index, self.handles = folder, {}, {}
        for file in files:
            with safe_open(file, framework="pt") as f:
                self.index.update({name: file for name in f.keys()})

    def names(self) -> set[str]:
        return set(self.index)

    def get(self, name: str) -> torch.Tensor:
        file = self.index[name]
        if file not in self.handles:
            self.handles[file] = safe_open(file, framework="pt")
        return self.handles[file].get_tensor(name)


def load_weights(source, cfg: ModelConfig, device, dtype) -> Transformer:
    """Allocate our Transformer on `device` and fill every buffer from `source` (a SafetensorsFolder
    or a GGUF file), by HF name."""
    names = source.names()
    specs = weight_specs(cfg, "transformer." if "transformer.wte.weight" in names else "")
    model = Transformer(cfg, device=device, dtype=dtype)
    buffers = dict(model.named_buffers())
    for spec in specs:
        target, row = buffers[spec.target], 0  # each part straight into its rows of the target, no cat
        for name, shape in spec.parts:
            if name not in names:
                raise EngineError(f"weights in '{source.where}' lack tensor '{name}' needed by {cfg.family}")
            tensor = source.get(name)
            if tuple(tensor.shape) != shape:
                raise EngineError(f"tensor '{name}' has shape {tuple(tensor.shape)}; config expects {shape}")
            rows = slice(row, row + shape[0])
            if spec.transpose:  # casts dtype, moves device
                target[:, rows].copy_(tensor.t())  # (in, out) target: the part's columns
            else:
                target[rows].copy_(tensor)
            row += shape[0]
        if row != target.shape[1 if spec.transpose else 0]:
            raise EngineError(f"tensors {[n for n, _ in spec.parts]} fill {row} rows of {spec.target}, "
                              f"which has {target.shape[1 if spec.transpose else 0]}")  # fmt: skip
    if not cfg.norm_affine:  # a LayerNorm without parameters is one with weight 1 and bias 0
        for name, buf in buffers.items():
            if name.endswith(("norm.weight", "norm.bias")):
                buf.fill_(1.0 if name.endswith("weight") else 0.0)
    return model


EMBEDDED_MODELS = Path(__file__).resolve().parent / "models"
EMBEDDED_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def resolve_source(model: str) -> str:
    """Turn what the user typed into a local folder or `preset:NAME`.

    Order: `preset:` prefix, an existing folder or .gguf file, the name of a model embedded in the
    repo (`chef` -> engine/models/chef), a model the engine fetches into its model cache
    (`assistant`, engine/model_store.py; fetched and converted on first use), then a hub id (downloaded with huggingface_hub; offline or
    unknown -> one-line EngineError). The app's menu of models (names, labels, an instructor's extra
    entries) is not the engine's business: it lives in `serving/catalog.py`, which hands
    `Engine.load` one of these sources.
    """
    if model.startswith("preset:"):
        return model
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir() and path.suffix.lower() != ".gguf":
            raise EngineError(f"model path '{model}' is a file; give the model's folder or a .gguf file")
        return str(path)
    if path.suffix.lower() == ".gguf":
        raise EngineError(f"GGUF file '{model}' does not exist")
    if EMBEDDED_NAME.match(model) and (EMBEDDED_MODELS / model / "config.json").is_file():
        return str(EMBEDDED_MODELS / model)
    from engine import model_store  # lazy: only a name that is not a folder looks in the model store

    if model in model_store.RECIPES:
        return str(model_store.ensure(model))
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        return _download(model)
    raise EngineError(
        f"model '{model}' not found: not a folder, preset:NAME, embedded model (engine/models/NAME) or hub id"
    )


def _download(repo_id: str) -> str:
    try:
        from huggingface_hub import snapshot_download  # lazy: only a hub id downloads

        return snapshot_download(repo_id, allow_patterns=HUB_PATTERNS)
    except Exception as err:  # offline, unknown repo, gated: all the same to the user
        raise EngineError(
            f"model '{repo_id}' is not a local folder and could not be fetched from the hub "
            f"({type(err).__name__}; offline or not found)"
        ) from None


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
CANONICAL_DTYPE = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def parse_device(device: str) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N', checked against the hardware that is really there."""
    try:
        dev = torch.device(str(device))
    except (RuntimeError, ValueError):
        raise EngineError(f"invalid device '{device}' (use cpu, cuda or cuda:N)") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise EngineError(f"unsupported device '{device}' (use cpu, cuda or cuda:N)")
    if not torch.cuda.is_available():
        raise EngineError(f"device '{device}' requested but no CUDA GPU is available; use cpu")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise EngineError(f"device '{device}' does not exist; this machine has {count} CUDA device(s)")
    return torch.device("cuda", dev.index or 0)


def parse_dtype(dtype: str) -> torch.dtype:
    if str(dtype) not in DTYPES:
        raise EngineError(f"invalid dtype '{dtype}' (use float32, bfloat16 or float16)")
    return DTYPES[str(dtype)]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    n_params: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    weight_bytes: int  # bytes the weights occupy on the device
    kv_bytes_per_token: int
    trained: bool  # False for presets (random weights: the text is noise, the timings are real)
    device: str
    dtype: str
    has_tokenizer: bool = True
    quant: str | None = None  # "int8": matmul weights stored as int8 (engine/quant.py); None: in `dtype`
    # the tokenizer carries the model's chat template (engine/chat.py renders it; `Engine.chat_prompt`)
    has_chat_template: bool = False
    decode_step: str = ""  # how pure-decode steps run, in words (engine/serving_core.py `describe_decode_step`)

    @property
    def precision(self) -> str:
        """One word for how it cooks: "int8" (int8 matrices, `dtype` for the rest), else `dtype`."""
        return self.quant or self.dtype


@dataclass
class LoadedModel:
    model: Transformer
    codec: object  # engine.text.TextCodec | None
    info: ModelInfo


def _eos_from_generation_config(folder: Path) -> tuple[int, ...]:
    path = folder / "generation_config.json"
    try:
        eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return ()
    return tuple(eos if isinstance(eos, list) else [eos]) if eos is not None else ()


def load_model(model: str, device: str = "cpu", dtype: str = "float32", quant: str | None = None) -> LoadedModel:
    """Everything `Engine.load` needs: weights on the device, the tokenizer, and a ModelInfo.

    `quant="int8"` stores the matmul weights as int8 after loading (engine/quant.py), a Q8_0 GGUF's
    as the file holds them (engine/gguf.py `int8_blocks`); `weight_bytes` then counts what is
    really on the device.
    """


    dev, dt, quant = parse_device(device), parse_dtype(dtype), parse_quant(quant)
    source = resolve_source(str(model))
    exact: dict = {}  # int8 weights the source holds as they are (a Q8_0 GGUF's), by buffer name
    if source.startswith("preset:"):

        net, codec = build_preset(source.removeprefix("preset:"), dev, dt)
        trained = False
    elif source.lower().endswith(".gguf"):
        from engine.gguf import (  # lazy: the gguf library only for a GGUF file
            gguf_codec,
            int8_blocks,
            read_gguf,
        )

        gguf = read_gguf(source)
        net, codec, trained = load_weights(gguf, config_from_hf(gguf.config), dev, dt), gguf_codec(gguf), True
        exact = int8_blocks(gguf, net.cfg) if quant is not None else {}
    else:
        folder = Path(source)
        cfg = read_config(folder)
        extra_eos = _eos_from_generation_config(folder)
        if extra_eos:
            cfg = replace(cfg, eos_ids=tuple(dict.fromkeys(cfg.eos_ids + extra_eos)))
        net = load_weights(SafetensorsFolder(folder), cfg, dev, dt)
        codec, trained = TextCodec.from_folder(folder), True
    if quant is not None:
        quantize(net, quant, exact)
    cfg = net.cfg
    weight_bytes = sum(
        b.numel() * b.element_size() for n, b in net.named_buffers() if not n.startswith("rope_")
    )
    info = ModelInfo(
        name=str(model), family=cfg.family, n_params=cfg.num_params(), n_layers=cfg.n_layers,
        d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size, max_context=cfg.max_context, weight_bytes=weight_bytes,
        kv_bytes_per_token=cfg.kv_bytes_per_token(dt.itemsize), trained=trained, device=str(dev),
        dtype=CANONICAL_DTYPE[dt], has_tokenizer=codec is not None, quant=quant,
        has_chat_template=getattr(codec, "chat_template", None) is not None,
    )  # fmt: skip
    return LoadedModel(net, codec, info)
