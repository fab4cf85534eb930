"""The instructor's caps per order: what one learner may ask of a shared kitchen.

Why: the engine refuses only what cannot work (past the context, past the KV memory); an order can
fit both and still hold the machine for minutes while every other learner waits. The caps keep one
order to a classroom-sized share. They are server-side: a TOML file the launcher is given
(`two-pot-kitchen --caps caps.toml`, or a `[caps]` table in its settings file; the app's process
finds it in its settings, serving/app_settings.py):

    [caps]
    max_order_tokens = 8192     # prompt tokens x tables, per order
    max_new_tokens = 512        # new tokens per table
    max_order_seconds = 120     # cooking time per order; past it the order is cancelled
    max_waiting = 2048          # requests waiting for a seat; past it a request is refused (503)

Every key is optional (the defaults below). A request over a cap is refused before it queues, in
one line naming the cap and its value; an order past its time is cancelled in one line
(`time_line`); a request that finds `max_waiting` requests already waiting for a seat is refused
at once with 503 and Retry-After (serving/http/admission.py). The default bound is generous: 2,048
waiting, so a class of a thousand streaming at once is queued, not refused. Lab experiments are
not orders: they pace themselves and are not capped here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from engine.errors import EngineError
from serving.app_settings import AppSettings

SETTINGS_TABLES = {"caps", "app", "model", "default"}  # the one settings file's tables (serving/app_settings.py)
KEYS = {"max_order_tokens": int, "max_new_tokens": int, "max_order_seconds": float, "max_waiting": int}


class CapExceeded(EngineError):
    """An order over one of the instructor's caps; `str()` names the cap and its value."""


@dataclass(frozen=True)
class Caps:
    max_order_tokens: int = 8192
    max_new_tokens: int = 512
    max_order_seconds: float = 120.0
    max_waiting: int = 2048  # requests waiting for a seat (beyond those cooking) before one is refused

    def check(self, prompt_tokens: list[int], max_new_tokens: int) -> None:
        """Refuse (CapExceeded, one line) an order of these prompts (token counts, one per table)."""
        total = sum(prompt_tokens)
        tables = f"{len(prompt_tokens)} table{'' if len(prompt_tokens) == 1 else 's'}"
        if total > self.max_order_tokens:
            raise CapExceeded(
                f"this order has {total:,} prompt tokens ({tables}); the instructor's "
                f"limit is {self.max_order_tokens:,} tokens per order (max_order_tokens)"
            )
        if max_new_tokens > self.max_new_tokens:
            raise CapExceeded(
                f"{max_new_tokens:,} new tokens asked; the instructor's limit is {self.max_new_tokens:,} "
                "new tokens per order (max_new_tokens)"
            )

    def time_line(self) -> str:
        """What an order past its time is told."""
        s = f"{self.max_order_seconds:g}"
        return f"cancelled after {s} s: the instructor's limit per order is {s} s"

    def summary(self) -> str:
        """The caps in one line, for the page."""
        return (
            f"Instructor's limits per order: {self.max_order_tokens:,} prompt tokens (all tables together), "
            f"{self.max_new_tokens:,} new tokens, {self.max_order_seconds:g} s of cooking."
        )


def load_caps(path: str | Path | None = None) -> Caps:
    """The caps from `path`, else from the app's settings' caps file, else the defaults."""
    path = path or AppSettings.current().caps
    if not path:
        return Caps()
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise EngineError(f"caps file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise EngineError(f"caps file {path} is not valid TOML: {' '.join(str(err).split())}") from None
    table = data.get("caps")
    if set(data) - SETTINGS_TABLES or not isinstance(table, dict):  # a settings file may hold [app] and [[model]] too
        raise EngineError(f"{path.name}: expected one [caps] table (found: {', '.join(sorted(data)) or 'nothing'})")
    values = {}
    for key, value in table.items():
        if key not in KEYS:
            raise EngineError(f"{path.name}: unknown cap '{key}' (allowed: {', '.join(KEYS)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise EngineError(f"{path.name}: '{key}' must be a positive number (got {value!r})")
        if KEYS[key] is int and value != int(value):
            raise EngineError(f"{path.name}: '{key}' must be a whole number (got {value!r})")
        values[key] = KEYS[key](value)
    return Caps(**values)


__all__ = ["CapExceeded", "Caps", "load_caps"]
