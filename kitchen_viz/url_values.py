"""A link's values, read in one place: every `?name=value` the app takes is checked here, the same way.

A shared link presets an order (`?prompt=32&batch=4&new=16&temp=0.7`), presenter mode
(`?presenter=1`) or the live view (`?live=0`). Python's `float()` takes "nan", "inf" and "-inf"
and `int()` refuses "2.0": neither is what a teacher means, and a NaN slips past every `min`/`max`
(every comparison with it is false), so a page would say "Temperature lowered to nan". Each value
is read by its kind and limits here, and a value that cannot be used is ignored with one line that
names it and what the link may say instead:

    >>> read("temp", "nan").problem
    'Ignored ?temp=nan: not a finite number (temp takes a number from 0 to 2).'
    >>> read("batch", "4").value
    4

A number outside its range is kept and moved inside by the order form, which says which way and
by which limit (the model's limits are only known there): "?temp=5 lowered to 2: 2 is the highest
offered".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

YES = ("1", "true", "yes", "on")
NO = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Kind:
    """What a link's value may be: "int", "float" or "bool", and a number's fixed limits (None: the
    model decides, and the order form moves the value inside its ceiling)."""

    kind: str
    low: float | None = None
    high: float | None = None

    def takes(self) -> str:
        if self.kind == "bool":
            return "1 or 0"
        what = "a whole number" if self.kind == "int" else "a number"
        if self.low is not None and self.high is not None:
            return f"{what} from {self.low:g} to {self.high:g}"
        return f"{what} of at least {self.low:g}" if self.low is not None else what


# Every value a link may set, with its kind: the one table the pages read.
KINDS = {
    "prompt": Kind("int", 1),
    "batch": Kind("int", 1),
    "new": Kind("int", 1),
    "temp": Kind("float", 0.0, 2.0),
    "wok": Kind("int", 1),
    "live": Kind("bool"),
    "reuse": Kind("bool"),
    "presenter": Kind("bool"),
}


@dataclass(frozen=True)
class UrlValue:
    """One link value as read: `value` when usable (still to be moved inside the model's range), else
    None and `problem`, the one line the page shows."""

    name: str
    raw: str
    value: int | float | bool | None
    problem: str | None = None


def read(name: str, raw: str) -> UrlValue:
    """`?name=raw` read as its kind (see KINDS). A value that is not of that kind, not finite, or (for
    a whole number) not whole is refused with one line naming it and what is taken."""
    kind = KINDS[name]

    def refuse(why: str) -> UrlValue:
        return UrlValue(name, raw, None, f"Ignored ?{name}={raw}: {why} ({name} takes {kind.takes()}).")

    text = raw.strip().lower()
    if kind.kind == "bool":
        if text in YES or text in NO:
            return UrlValue(name, raw, text in YES)
        return refuse("not on or off")
    try:
        number = float(text)
    except ValueError:
        return refuse("not a number")
    if not math.isfinite(number):
        return refuse("not a finite number")
    if kind.kind == "int":
        if number != int(number):
            return refuse("not a whole number")
        return UrlValue(name, raw, int(number))
    return UrlValue(name, raw, number)


def flag(name: str, raw: str | None, default: bool = False) -> bool:
    """A yes/no link value (`?presenter=1`); anything not a clear yes or no keeps `default`."""
    if raw is None:
        return default
    v = read(name, raw)
    return default if v.value is None else bool(v.value)
