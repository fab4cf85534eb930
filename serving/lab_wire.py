"""A lab experiment's settings, progress and result as JSON, so a kitchen server can run the Lab.

An experiment's result is a tree of our own frozen dataclasses (its points, a `Sample` with a real
run's `Metrics` and `Trace`, a measured `Roofline`, notes), tuples, lists, dicts and numbers. Each
dataclass travels with its name and is rebuilt from it, but only classes of this project's own
packages (`ALLOWED`), so a client never builds an arbitrary object from what a server sends: JSON,
never pickle.

    encode(PaddingSettings(lengths=(8, 16), repeats=3))
    -> {"__dc__": "lab.padding:PaddingSettings", "lengths": {"__tuple__": [8, 16]}, "repeats": 3}
    decode(json.loads(json.dumps(that))) == PaddingSettings(lengths=(8, 16), repeats=3)

Floats go through JSON's `repr` (exact); NaN and infinity use Python's JSON extensions (both
ends are this project).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pandas as pd

ALLOWED = ("lab.", "engine.", "bench.", "serving.")  # the packages whose dataclasses may travel
MARKERS = ("__dc__", "__tuple__", "__dict__", "__frame__")


def encode(obj: Any) -> Any:
    """`obj` as plain JSON values. Raises TypeError naming what cannot travel."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        name = f"{cls.__module__}:{cls.__qualname__}"
        if not cls.__module__.startswith(ALLOWED):
            raise TypeError(f"{name} is not one of this project's classes; it cannot travel")
        return {"__dc__": name} | {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {"__dict__": [[encode(k), encode(v)] for k, v in obj.items()]}
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:  # a numpy scalar
        return obj.item()
    if type(obj).__name__ == "DataFrame":
        return {"__frame__": encode(obj.to_dict(orient="list"))}
    raise TypeError(f"a {type(obj).__name__} cannot travel as JSON (in a lab result)")


def decode(obj: Any) -> Any:
    """The value `encode` was given. Raises ValueError naming what is wrong."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tuple__" in obj:
        return tuple(decode(v) for v in obj["__tuple__"])
    if "__dict__" in obj:
        return {decode(k): decode(v) for k, v in obj["__dict__"]}
    if "__frame__" in obj:
        return pd.DataFrame(decode(obj["__frame__"]))
    if "__dc__" in obj:
        cls = _class(obj["__dc__"])
        values = {k: decode(v) for k, v in obj.items() if k != "__dc__"}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        out = cls(**{k: v for k, v in values.items() if k in init})
        for k, v in values.items():
            if k not in init:
                object.__setattr__(out, k, v)
        return out
    raise ValueError(f"an object without a type marker ({', '.join(MARKERS)}) in a lab message: {list(obj)[:4]}")


def _class(name: str) -> type:
    module, _, qualname = str(name).partition(":")
    if not module.startswith(ALLOWED) or not qualname or "." in qualname:
        raise ValueError(f"'{name}' is not one of this project's classes")
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        raise ValueError(f"no class '{name}' here (is the server running another version of Two-Pot Kitchen?)") from None
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"'{name}' is not a dataclass")
    return cls
