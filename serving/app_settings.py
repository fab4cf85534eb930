"""The app's settings as one typed object: what `two-pot-kitchen` decided, for the process it starts.

The launcher (kitchen_viz/launch.py) builds `AppSettings` from its command line, over an optional
TOML file (`--settings app.toml`, an `[app]` table with the same names). The Streamlit process it
starts is a new interpreter, so the settings travel in that process's environment: `to_env()`
writes the variables, `from_env()` reads them back, and nothing else in the app reads them. The
model catalog and the instructor's caps are files of their own that travel the same way through
their modules (serving/catalog.py `TWO_POT_CATALOG`, serving/caps.py `TWO_POT_CAPS`); every
variable is listed in docs/architecture.md.

    AppSettings(kitchens=True, class_model="chef").to_env()
    -> {"TWO_POT_KITCHENS": "1", "TWO_POT_CLASS_KITCHEN": "chef"}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

import tomllib

from engine.errors import EngineError

ENV = {
    "backend": "TWO_POT_BACKEND",  # a kitchen server's URL: the Kitchen and the class pages order there
    "backend_key": "TWO_POT_BACKEND_KEY",
    "kitchens": "TWO_POT_KITCHENS",  # mount the Kitchen's kitchens in the app's server
    "class_model": "TWO_POT_CLASS_KITCHEN",  # the class kitchen's model, mounted at /class
    "class_key": "TWO_POT_CLASS_KEY",
    "presenter": "TWO_POT_PRESENTER",  # presenter mode on for every session
    "pin_server": "TWO_POT_PIN_SERVER",  # the app's threads off the engine's cores
    "batch_invariant": "TWO_POT_BATCH_INVARIANT",  # float32 CPU kitchens answer as if each prompt were alone
}

FILE_KEYS = ("backend", "backend_key", "class_model", "class_key", "presenter", "batch_invariant")  # what a settings file may set


@dataclass(frozen=True)
class AppSettings:
    backend: str | None = None
    backend_key: str | None = None
    kitchens: bool = False
    class_model: str | None = None
    class_key: str | None = None
    presenter: bool = False
    pin_server: bool = False
    batch_invariant: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AppSettings:
        """What the launcher handed this process (the defaults where it set nothing)."""
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(ENV[f.name])
            if raw:
                values[f.name] = raw == "1" if f.type == "bool" else raw
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The variables that carry these settings (an unset or false one is left out)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value:
                out[ENV[f.name]] = "1" if value is True else str(value)
        return out

    @classmethod
    def from_toml(cls, path: str | Path) -> AppSettings:
        """The `[app]` table of a TOML file; a one-line EngineError names what is wrong with it."""
        try:
            table = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("app", {})
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise EngineError(f"settings file {path}: {' '.join(str(err).split())}") from None
        known = {f.name: f.type for f in fields(cls) if f.name in FILE_KEYS}
        for key, value in table.items():
            if key not in known:
                raise EngineError(f"settings file {path}: unknown key '{key}' in [app] (known: {', '.join(known)})")
            kind = bool if known[key] == "bool" else str
            if not isinstance(value, kind):
                raise EngineError(f"settings file {path}: [app] {key} must be {'true or false' if kind is bool else 'a string'}")
        return cls(**table)

    def over(self, base: AppSettings) -> AppSettings:
        """These settings where set (not None or False), `base`'s elsewhere: the command line over a file."""
        return replace(base, **{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)})
