"""The host's watchdog: a loop that is alive but silent is stopped, so the host can start a fresh one.

A loop that dies shows itself: its end of the pipe closes and the reader sees EOF. A loop that is
alive but stuck (a deadlock, a wedged device, a step that never ends) does not. So while anything
is in flight, the watchdog waits for the loop's next message at most `silence_limit_s()` and then
kills it; the reader sees the death, tells every request in flight why in one line (`hung_line`)
and starts a fresh loop.

Every step's news leaves the loop within 50 ms of the step (serving/host/loop.py), and one step
processes at most the token budget, so a healthy loop is silent for one step at most.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

SILENCE_ENV = "TWO_POT_SILENCE_S"  # a test hook: replaces SILENCE_FLOOR_S
SILENCE_FLOOR_S = 60.0  # the watchdog never calls a loop hung sooner
SILENCE_STEPS = 20  # ... nor before this many times the longest step it has measured
SWEEP_SILENCE_S = 600.0  # while a Lab sweep runs: a sweep paces itself, a point may take minutes
WATCH_S = 0.5  # how often the watchdog looks


def silence_floor_s() -> float:
    return float(os.environ.get(SILENCE_ENV) or SILENCE_FLOOR_S)


def silence_limit_s(longest_step_s: float, floor_s: float | None = None) -> float:
    """How long a loop with work in flight may send nothing. Example: the chef's longest step
    0.4 s: max(60, 20 x 0.4) = 60 s."""
    return max(silence_floor_s() if floor_s is None else floor_s, SILENCE_STEPS * longest_step_s)


def hung_line(model: str, limit_s: float) -> str:
    """The one line the requests in flight fail with when their loop was stopped as hung."""
    return (f"the engine process for {model} sent nothing for {limit_s:,.0f} s (the limit for this order) "
            "and was stopped as hung; the kitchen restarts it for the next order")  # fmt: skip


class Watchdog:
    """Every WATCH_S: `hung(limit_s)` says whether the loop has been silent past `limit_s` with work in
    flight (and, if so, marks it hung); then `kill()` stops it. Runs until `closed()`."""

    def __init__(self, name: str, limit_s: Callable[[], float], hung: Callable[[float], bool],
                 kill: Callable[[], None], closed: Callable[[], bool]):  # fmt: skip
        self._limit_s, self._hung, self._kill, self._closed = limit_s, hung, kill, closed
        threading.Thread(target=self._watch, daemon=True, name=name).start()

    def _watch(self) -> None:
        while not self._closed():
            time.sleep(WATCH_S)
            if self._hung(self._limit_s()):
                self._kill()
