"""The app's settings as one typed object: defaults, under one TOML file, under the command line.

The launcher (kitchen_viz/launch.py) builds `AppSettings` from its command line over an optional
settings file (`--settings app.toml`: an `[app]` table of these names; the same file may hold the
instructor's `[caps]` table and `[[model]]` catalog entries, and then it is the caps file and an
extra catalog too). The Streamlit process it starts is a new interpreter, so the launcher writes
the resolved settings to a file of its own (readable by this user only: it may hold API keys) and
hands its path to the app's script (`streamlit run serve.py -- --app-settings FILE`);
`AppSettings.current()` reads it once in that process. Without a launcher (plain `streamlit run
app.py`, the tests, a script) it is the defaults. Every module asks `current()`: the caps
(serving/caps.py), the extra catalogs (serving/catalog.py), the engine's threads and cores
(serving/cores.py), the hosts to mount (serving/http/mounted.py), the pages. No environment
variable carries a setting; the few that remain are test hooks (docs/architecture.md lists them).

    s = AppSettings(kitchens=True, class_model="chef", threads=1)
    s.write(path)  ->  AppSettings.read(path) == s
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import tomllib

from engine.errors import EngineError

HANDOFF_FLAG = "--app-settings"  # the app's script argument naming the launcher's resolved settings
FILE_KEYS = ("backend", "backend_key", "class_model", "class_key", "presenter", "batch_invariant", "threads", "pin")


@dataclass(frozen=True)
class AppSettings:
    backend: str | None = None  # a kitchen server's URL: the Kitchen and the class pages order there
    backend_key: str | None = None
    kitchens: bool = False  # mount the Kitchen's kitchens in the app's server
    class_model: str | None = None  # the class kitchen's model, mounted at /class
    class_key: str | None = None
    presenter: bool = False  # presenter mode on for every session
    pin_server: bool = False  # the app's threads off the engine's cores
    batch_invariant: bool = False  # float32 CPU kitchens answer as if each prompt were alone
    caps: str | None = None  # the instructor's caps file, a [caps] table (serving/caps.py)
    catalogs: tuple[str, ...] = ()  # extra model catalogs (docs/models.md)
    threads: int = 0  # the engine's torch threads; 0: every core but one (serving/cores.py)
    pin: bool = True  # the engine's threads on cores of their own, the app's on the others
    warm: tuple[str, ...] = ()  # catalog models whose kitchen opens at launch, once cached (the assistant)

    @classmethod
    def current(cls) -> AppSettings:
        """This process's settings: the launcher's, or the defaults (read once)."""
        global _CURRENT
        if _CURRENT is None:
            argv = sys.argv[1:]
            path = argv[argv.index(HANDOFF_FLAG) + 1] if HANDOFF_FLAG in argv[:-1] else None
            _CURRENT = cls.read(path) if path else cls()
        return _CURRENT

    @classmethod
    def read(cls, path: str | Path) -> AppSettings:
        """What `write` wrote."""
        values = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})  # JSON has no tuples

    def write(self, path: str | Path | None = None) -> Path:
        """These settings as a file only this user can read (a new one when `path` is None)."""
        if path is None:
            fd, path = tempfile.mkstemp(prefix="two-pot-kitchen-", suffix=".json")
            os.close(fd)
        path = Path(path)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")
        return path

    @classmethod
    def from_toml(cls, path: str | Path) -> AppSettings:
        """The `[app]` table of a TOML file; its `[caps]` table and `[[model]]` entries make it the caps
        file and an extra catalog. A one-line EngineError names what is wrong with it."""
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise EngineError(f"settings file {path}: {' '.join(str(err).split())}") from None
        table = data.get("app", {})
        known = {f.name: f.type for f in fields(cls) if f.name in FILE_KEYS}
        for key, value in table.items():
            if key not in known:
                raise EngineError(f"settings file {path}: unknown key '{key}' in [app] (known: {', '.join(known)})")
            kind = {"bool": bool, "int": int}.get(known[key], str)
            if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
                rule = {bool: "true or false", int: "a whole number >= 0", str: "a string"}[kind]
                raise EngineError(f"settings file {path}: [app] {key} must be {rule}")
        resolved = str(Path(path).resolve())
        return cls(**table, caps=resolved if "caps" in data else None,
                   catalogs=(resolved,) if "model" in data else ())  # fmt: skip

    def over(self, base: AppSettings) -> AppSettings:
        """These settings where set (not None, False, 0 or empty), `base`'s elsewhere: the command line
        over a file. `pin` is on unless either turned it off."""
        mine = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("pin", "catalogs") and getattr(self, f.name)}  # fmt: skip
        return replace(base, **mine, catalogs=base.catalogs + self.catalogs, pin=self.pin and base.pin)


_CURRENT: AppSettings | None = None
