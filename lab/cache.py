"""Lab results kept on disk, keyed by what produced them: experiment, model, device, dtype, settings.

Why: a class opens the same experiment page on thirty laptops pointed at one server. The first
run measures; everyone else (and the teacher re-opening the page tomorrow) sees that measurement
at once, labelled with when it was taken, with a "re-run" button for a fresh one.

Why on disk and pickled: results are plain dataclasses (numbers, lists, the engine's Trace), and a
server restart should not throw them away. The key includes `SCHEMA`, so changing a result's shape
makes old files invisible instead of unreadable. A file that fails to load counts as a miss.

Where: `$TWO_POT_LAB_CACHE`, else `~/.cache/two-pot-kitchen/lab`. Tests pass `tmp_path`.

Example:
    cache = ResultCache()
    key = cache_key("banquet", "chef", "cpu", "float32", settings)
    result = cache.get(key) or cache.put(key, run_banquet(engine, settings))
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from serving.catalog import resolve_source

SCHEMA = 4  # bump when a result dataclass changes shape


@dataclass(frozen=True)
class CachedResult:
    result: Any
    saved_at: float  # time.time() when measured
    key: str


def default_dir() -> Path:
    return Path(os.environ.get("TWO_POT_LAB_CACHE") or Path.home() / ".cache" / "two-pot-kitchen" / "lab")


def cache_key(experiment: str, model: str, device: str, dtype: str, settings: Any) -> str:
    """A short stable hash of everything that determines the measurement."""
    fields = asdict(settings) if is_dataclass(settings) else settings
    blob = json.dumps(
        {
            "schema": SCHEMA,
            "experiment": experiment,
            "model": model,
            "device": device,
            "dtype": dtype,
            "settings": fields,
        },
        sort_keys=True,
        default=str,
    )
    return f"{experiment}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def model_fingerprint(model: str) -> str:
    """The identity of the weights behind a model name: retrained weights must not reuse old results.

    A catalog name or folder becomes its safetensors files' names, sizes and modification times
    ("chef" before and after retraining are different kitchens); presets and hub ids stay as named.
    """
    try:
        source = resolve_source(model) or model
    except Exception:  # noqa: BLE001 -- no catalog or an unlisted name: the name itself is the identity
        source = model
    folder = Path(source)
    if not folder.is_dir():
        return model
    stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.glob("*.safetensors"))]
    return f"{model}@{hashlib.sha256(repr(stats).encode()).hexdigest()[:12]}"


class ResultCache:
    def __init__(self, folder: Path | str | None = None):
        self.folder = Path(folder) if folder is not None else default_dir()

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.pkl"

    def get(self, key: str) -> CachedResult | None:
        p = self.path(key)
        try:
            with p.open("rb") as f:
                saved = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError):
            return None
        return saved if isinstance(saved, CachedResult) else None

    def put(self, key: str, result: Any) -> CachedResult:
        """Save atomically (write a temp file, then rename), so a reader never sees half a file."""
        saved = CachedResult(result=result, saved_at=time.time(), key=key)
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path(key).with_suffix(f".tmp{os.getpid()}")
        with tmp.open("wb") as f:
            pickle.dump(saved, f)
        tmp.replace(self.path(key))
        return saved

    def drop(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)


def roof_key(device: str, dtype: str) -> str:
    """Where the latest measured roofline of a device/dtype is kept (a machine fact, not a model's)."""
    return cache_key("roof-latest", "-", device, dtype, {})


def remember_roof(roof, cache: ResultCache | None = None) -> None:
    """Keep the roofline the lab just measured, so other pages' inspectors can use it."""
    (cache or ResultCache()).put(roof_key(roof.device, roof.dtype), roof)


def latest_roof(device: str, dtype: str, cache: ResultCache | None = None):
    """The most recent `engine.bench.roofline.Roofline` measured for this device/dtype, or None.

    The kitchen page passes it to `lab.inspector.diagnose`, which can then tell a bandwidth-bound
    pot from a compute-bound one; without it the inspector says it cannot tell.
    """
    saved = (cache or ResultCache()).get(roof_key(device, dtype))
    return saved.result if saved is not None else None
