"""The queue bound: how many orders may wait for a seat before the kitchen says "come back later".

Why: a continuous batch admits every request into its line, so under a rush bigger than the room
the wait grows with every client (each one's TTFT is the whole line ahead of it) and no client can
tell a slow kitchen from a stuck one. Past the instructor's bound (`max_waiting` in the caps file,
or `two-pot-kitchen serve --max-waiting N`) a request is refused at once: HTTP 503 with one line and
`Retry-After`, the seconds the kitchen took to finish one order lately (the median over the orders
finished in the last minute, measured here; 1 s before any has finished). Nothing admitted is
dropped: the bound is checked before a request enters the kitchen, never after.

What counts: every request the engine holds (cooking in a seat or waiting for one), a table of an
`n` > 1 order or of a Kitchen order as one each. An order of k tables is admitted when
held + k <= seats + max_waiting.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

from serving.http.openai_api import ApiError

WINDOW_S = 60.0  # Retry-After is the median time of the orders finished this recently


class Full(ApiError):
    """503: the kitchen's line is at the instructor's bound; `retry_after` seconds, measured."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(503, message, kind="server_overloaded")
        self.retry_after = retry_after


class Admission:
    """Counts what the engine holds (`held()`, the engine client's requests in flight) against the bound;
    `on_refused()` is called at each refusal (the server's twopot:request_refused_total)."""

    def __init__(self, held, seats: int, max_waiting: int, on_refused=lambda: None):
        self.held, self.seats, self.max_waiting, self.on_refused = held, seats, max_waiting, on_refused
        self._finished: deque[tuple[float, float]] = deque()  # (monotonic time, seconds the order took)
        self.refused = 0

    @property
    def bound(self) -> int:
        return self.seats + self.max_waiting

    def admit(self, tables: int) -> None:
        """Raise Full (503, one line) when `tables` more requests would pass the bound."""
        held = self.held()
        if held + tables > self.bound:
            self.refused += 1
            self.on_refused()
            waiting = max(0, held - self.seats)
            raise Full(f"the kitchen is full: {waiting:,} orders are waiting for its {self.seats:,} seats; the "
                       f"instructor's limit is {self.max_waiting:,} waiting (max_waiting); retry in "
                       f"{self.retry_after()} s", self.retry_after())  # fmt: skip

    def finished(self, seconds: float) -> None:
        """An order left the kitchen after `seconds` (arrival to its last token)."""
        now = time.monotonic()
        self._finished.append((now, seconds))
        while self._finished and self._finished[0][0] < now - WINDOW_S:
            self._finished.popleft()

    def retry_after(self) -> int:
        recent = [s for t, s in self._finished if t >= time.monotonic() - WINDOW_S]
        return max(1, math.ceil(statistics.median(recent))) if recent else 1
