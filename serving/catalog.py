"""The model catalog: the one allow-listed menu of models the app may load.

Why an allow-list: the browser must never name an arbitrary path or hub id; it picks a *catalog name*
and the server resolves it. The menu lives in `catalog.toml` beside this module; an instructor adds
entries with server-side files only (the launcher's `--catalog extra.toml`, or `[[model]]` entries in
its settings file: the app's settings carry them, serving/app_settings.py).

A catalog file:

    allowed_roots = ["/srv/models"]      # extra folders local entries may live in (server-side only)

    [[model]]
    name = "chef"                        # what the browser picks; unique across all files
    path = "/srv/models/chef"            # exactly one of path / preset / hub / gguf / fetch
    label = "The chef"                   # short text for a picker
    trained = true                       # optional; presets are always false
    description = "..."                  # optional

    [[model]]
    name = "preset:smollm2-135m"
    preset = "smollm2-135m"              # a real architecture's shape, random weights, built locally

Two more sources: `gguf = "model.gguf"` (a GGUF file, llama.cpp's format) and `fetch = "assistant"`
(a model fetched on first use into the model cache, engine/model_store.py).

Relative paths are relative to the file that names them. Local folders and GGUF files must sit under
the engine's embedded models (`engine/models/`) or one of the `allowed_roots`. Every refusal is one `EngineError` line.

`describe(entry)` gives the facts a picker shows (parameters, bytes per dtype, KV bytes per token)
from config.json, a GGUF's metadata, a fetched model's recipe or the preset's config alone: no weights are read, so a 5 GB preset costs nothing
to describe. `fits(entry, dtype, device)` says before loading whether the weights would fit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from engine.config import ModelConfig, config_from_hf
from engine.errors import EngineError
from engine.loader import EMBEDDED_MODELS
from serving.app_settings import AppSettings

DEFAULT_CATALOG = Path(__file__).resolve().parent / "catalog.toml"
MODELS_ROOT = EMBEDDED_MODELS
RANDOM_WEIGHTS_NOTE = "random weights: timing is real, text is not"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

FILE_KEYS = {"allowed_roots", "default", "model", "app", "caps"}  # [app] and [caps]: the one settings file's
ENTRY_KEYS = {"name", "path", "preset", "hub", "gguf", "fetch", "label", "trained", "description"}
SOURCE_KEYS = ("path", "preset", "hub", "gguf", "fetch")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Entry:
    """One menu item. `source` is what `Engine.load` receives: a folder path, `preset:NAME`, a hub id,
    a .gguf file's path or a fetched model's name (`assistant`)."""

    name: str
    source: str
    label: str  # always ends with RANDOM_WEIGHTS_NOTE when `trained` is False
    trained: bool
    description: str = ""
    kind: str = "path"  # "path" | "preset" | "hub" | "gguf" | "fetch"
    catalog_file: str = ""  # which file defined it (for error messages)


@dataclass(frozen=True)
class EntryFacts:
    """What a picker shows, computed from the config alone.

    `weight_bytes` and `kv_bytes_per_token` are keyed by precision: a dtype name ("float32",
    "bfloat16", "float16") or "int8" (int8 matrices with a scale per output channel, float32 for
    the rest and the KV cache; engine/quant.py).
    Example, the SmolLM2-135M preset: n_params 134,515,008; weight_bytes["float32"] 538,060,032;
    kv_bytes_per_token["float32"] 46,080 (2 x 30 layers x 3 KV heads x 64 x 4 bytes).
    """

    n_params: int
    weight_bytes: dict[str, int]
    kv_bytes_per_token: dict[str, int]
    max_context: int
    family: str
    trained: bool


@dataclass(frozen=True)
class Fit:
    """`fits()`'s answer: ok, plus the numbers behind it and a one-line message for the UI."""

    ok: bool
    need_bytes: int
    available_bytes: int
    message: str


@dataclass
class Catalog:
    entries: list[Entry] = field(default_factory=list)
    allowed_roots: list[Path] = field(default_factory=list)
    default_name: str = "chef"

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def get(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise EngineError(f"unknown model '{name}'; the catalog has: {', '.join(self.names())}")

    @property
    def default(self) -> Entry:
        return self.get(self.default_name)


def _extra_paths_from_settings() -> list[Path]:
    return [Path(p) for p in AppSettings.current().catalogs]


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise EngineError(f"catalog file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise EngineError(f"catalog file {path} is not valid TOML: {err}") from None


def _check_keys(found: set[str], allowed: set[str], where: str) -> None:
    unknown = sorted(found - allowed)
    if unknown:
        raise EngineError(f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _parse_entry(raw: dict, file: Path, roots: list[Path]) -> Entry:
    """One [[model]] table -> Entry, with its source resolved and checked."""
    if not isinstance(raw, dict):
        raise EngineError(f"{file.name}: every [[model]] must be a table")
    name = raw.get("name")
    where = f"{file.name}: model '{name}'" if name else f"{file.name}: a [[model]] entry"
    _check_keys(set(raw), ENTRY_KEYS, where)
    if not isinstance(name, str) or not name.strip():
        raise EngineError(f"{where} has no 'name'")
    sources = [k for k in SOURCE_KEYS if k in raw]
    if len(sources) != 1:
        raise EngineError(f"{where} needs exactly one of {', '.join(SOURCE_KEYS)} (found {len(sources)})")
    kind = sources[0]
    value = raw[kind]
    if not isinstance(value, str) or not value.strip():
        raise EngineError(f"{where}: '{kind}' must be a non-empty string")
    trained = raw.get("trained", kind != "preset")
    if not isinstance(trained, bool):
        raise EngineError(f"{where}: 'trained' must be true or false")
    if kind == "preset":
        if trained:
            raise EngineError(f"{where}: a preset has random weights, so 'trained' cannot be true")
        from engine.presets import PRESETS  # lazy: the catalog is read before torch; presets import it

        preset = value.removeprefix("preset:")
        if preset not in PRESETS:
            raise EngineError(f"{where}: unknown preset '{preset}' (available: {', '.join(PRESETS)})")
        source = f"preset:{preset}"
    elif kind == "hub":
        if not HUB_ID.match(value):
            raise EngineError(f"{where}: hub id '{value}' is not of the form owner/name")
        source = value
    elif kind == "fetch":
        from engine.model_store import RECIPES  # lazy: as above

        if value not in RECIPES:
            raise EngineError(f"{where}: no fetched model '{value}' (known: {', '.join(RECIPES)})")
        source = value
    else:
        folder = (file.parent / value).resolve()
        if kind == "gguf" and folder.suffix.lower() != ".gguf":
            raise EngineError(f"{where}: gguf '{value}' must name a .gguf file")
        if not _inside(folder, roots):
            allowed = ", ".join(str(r) for r in roots)
            raise EngineError(f"{where}: path {folder} is outside the allowed roots ({allowed})")
        source = str(folder)
    label = str(raw.get("label") or name)
    if not trained and RANDOM_WEIGHTS_NOTE not in label:
        label = f"{label} ({RANDOM_WEIGHTS_NOTE})"
    return Entry(name, source, label, trained, str(raw.get("description", "")), kind, str(file))


def _allowed_roots(data: dict, file: Path) -> list[Path]:
    roots = data.get("allowed_roots", [])
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise EngineError(f"{file.name}: 'allowed_roots' must be a list of folder paths")
    return [(file.parent / r).resolve() for r in roots]


def load_catalog(path: str | Path | None = None, extra_paths: tuple = ()) -> Catalog:
    """Read the main catalog plus extras (arguments first, then the app's settings'), merged in order.

    Allowed roots are collected from every file before any entry is checked, so an instructor's
    file may list the folder and its models together. Duplicate names anywhere are refused.
    """
    files = [Path(path) if path else DEFAULT_CATALOG, *map(Path, extra_paths), *_extra_paths_from_settings()]
    files = list(dict.fromkeys(f.resolve() for f in files))  # a file named twice is read once
    parsed = []
    for f in files:
        data = _read_toml(f)
        _check_keys(set(data), FILE_KEYS, f.name)
        parsed.append((f, data))
    roots = [MODELS_ROOT.resolve()] + [r for f, d in parsed for r in _allowed_roots(d, f)]
    catalog = Catalog(allowed_roots=roots)
    for f, data in parsed:
        if "default" in data:
            catalog.default_name = str(data["default"])
        models = data.get("model", [])
        if not isinstance(models, list):
            raise EngineError(f"{f.name}: 'model' must be an array of tables ([[model]])")
        for raw in models:
            entry = _parse_entry(raw, f, roots)
            if entry.name in catalog.names():
                first = Path(catalog.get(entry.name).catalog_file).name
                raise EngineError(
                    f"{f.name}: duplicate model name '{entry.name}' (already defined in {first})"
                )
            catalog.entries.append(entry)
    catalog.get(catalog.default_name)  # the default must exist: fail at load, not at first click
    return catalog


def resolve_source(name: str, catalog: Catalog | None = None) -> str | None:
    """Catalog name -> what Engine.load understands (folder path, `preset:NAME`, hub id); None if unlisted."""
    cat = catalog or load_catalog()
    return next((e.source for e in cat.entries if e.name == name), None)


def check_extra_catalogs(paths: list[str | Path]) -> tuple[str, ...]:
    """For the launcher's `--catalog`: the files' resolved paths, each named once, once the merged
    menu has been read (a bad file is refused now, in one line, not at the app's first page)."""
    merged = tuple(dict.fromkeys(str(Path(p).resolve()) for p in paths))
    load_catalog(extra_paths=merged)  # raises EngineError on a bad file
    return merged


def _model_config(entry: Entry) -> ModelConfig:
    """The entry's shape from its config.json (or the preset's), without touching weights or the network."""
    if entry.kind == "preset":
        from engine import presets  # lazy: as above: torch loads only for a preset's figures

        return presets.preset_config(entry.source.removeprefix("preset:"))
    if entry.kind == "gguf":
        from engine.gguf import gguf_config  # lazy: the metadata only; no tensor is read

        try:
            return config_from_hf(gguf_config(entry.source))
        except FileNotFoundError:
            raise EngineError(f"model '{entry.name}': GGUF file {entry.source} does not exist") from None
    if entry.kind == "fetch":
        from engine import model_store  # lazy: as above

        folder = model_store.cached(entry.source)
        raw = json.loads((folder / "config.json").read_text()) if folder else model_store.recipe(entry.source).config
        return config_from_hf(raw)
    if entry.kind == "path":
        file = Path(entry.source) / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache  # lazy: huggingface_hub only for a hub id

        cached = try_to_load_from_cache(entry.source, "config.json")
        if not isinstance(cached, str):
            raise EngineError(
                f"hub model '{entry.source}' is not in the local cache; its facts need a download"
            )
        file = Path(cached)
    try:
        return config_from_hf(json.loads(file.read_text()))
    except FileNotFoundError:
        raise EngineError(f"model '{entry.name}': no config.json in {file.parent}") from None


def describe(entry: Entry) -> EntryFacts:
    """Parameters, bytes per dtype and KV bytes per token, from the config alone (no weights loaded)."""
    from engine.costs import weight_bytes  # lazy: as above: torch loads only for a preset's figures

    cfg = _model_config(entry)
    n = cfg.num_params()
    # int8: what a pass reads, plus the float32 embedding table every token is gathered from (a tied
    # model keeps its own copy of it beside the int8 LM head, engine/quant.py)
    tables = cfg.vocab_size * cfg.d_model + (cfg.max_context * cfg.d_model if cfg.positions == "learned" else 0)
    int8 = weight_bytes(cfg, 4, quant="int8") + 4 * tables
    return EntryFacts(
        n_params=n,
        weight_bytes={dt: n * b for dt, b in DTYPE_BYTES.items()} | {"int8": int8},
        kv_bytes_per_token={dt: cfg.kv_bytes_per_token(b) for dt, b in DTYPE_BYTES.items()}
        | {"int8": cfg.kv_bytes_per_token(4)},
        max_context=cfg.max_context,
        family=cfg.family,
        trained=entry.trained,
    )


def fits(entry: Entry, dtype: str = "float32", device: str = "cpu", available: int | None = None) -> Fit:
    """Would this entry's weights fit in `device` memory at `dtype`? Answered before loading anything.

    `available` overrides the measured free memory (MemAvailable on CPU, free memory on CUDA).
    Example: the Llama-3.2-1B preset in float32 is 1.236 B x 4 bytes = 4.9 GB of weights; with 3 GB
    free the answer is ok=False with a message naming both numbers, and bfloat16 (2.5 GB) still fails.
    """
    if dtype == "int8":  # loading holds the float32 weights before they are quantized: that is the peak
        dtype = "float32"
    if dtype not in DTYPE_BYTES:
        raise EngineError(f"unsupported dtype '{dtype}' (supported: {', '.join(DTYPE_BYTES)}, int8)")
    if entry.kind == "preset":
        import torch  # lazy: torch only when sizing a preset

        from engine import presets  # lazy: as above

        need = presets.bytes_needed(entry.source.removeprefix("preset:"), getattr(torch, dtype))
    else:
        need = describe(entry).weight_bytes[dtype]
    if available is None:
        import torch  # lazy: torch only when sizing a preset

        from engine.limits import available_memory  # lazy: as above

        available = available_memory(torch.device(device))
    gb = 1e9
    from engine.presets import USABLE_FRACTION  # lazy: the engine's own rule, so preview and refusal agree

    if need > USABLE_FRACTION * available:
        return Fit(
            False,
            need,
            available,
            f"{entry.name} needs {need / gb:.2f} GB for its {dtype} weights but only {available / gb:.2f} GB "
            f"is available on {device}; try bfloat16 or a smaller model",
        )
    return Fit(
        True,
        need,
        available,
        f"{entry.name}: {need / gb:.2f} GB of {dtype} weights, {available / gb:.1f} GB free",
    )
