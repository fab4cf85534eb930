"""What the host remembers of each streaming request, so a crash of its engine loses none of them.

When the engine process dies (killed, out of memory) or is stopped as hung (serving/host/watchdog.py),
every request it held was cooking or waiting. The host keeps, per request, what it was asked
(prompt, max_new_tokens, settings) and the token ids already streamed to its client; once the fresh
process is ready, each request is submitted again with `resume` = those tokens (serving/host/wire.py
`Submit`): the loop cooks prompt + streamed tokens as the new prompt, for the tokens still owed, with
the same settings, and the client's stream goes on where it stopped, with no error.

    prompt "ROMEO:" (3 ids), max_new_tokens 16, streamed "Ay, " (4 ids) when the engine died
    -> Submit(key, "ROMEO:", 12, settings, resume=[4 ids]): 3 + 4 prompt ids, 12 new, indices 4, 5, ...

What holds: a greedy answer is the answer the request would have had without the crash whenever the
engine computes a token's logits the same whatever else shares its pass (the engine's
`batch_invariant` mode; `two-pot-kitchen serve --batch-invariant`); without it the resumed prompt is
prefilled in one pass where the first process decoded it token by token, a reordering of float sums
that may flip a near-tie between two tokens, so the continuation is the model's greedy answer to the
same text, not always the same bits. A sampled request keeps its seed and the loop advances its
generator past the draws already made (one draw per token, engine/sampling.py), so its continuation is
the sample it would have drawn, under the same condition; with speculative decoding (draft tokens
drawn too) it is a fresh sample from the same distribution.

A Kitchen order (several tables, `wire.PlaceOrder`) is remembered the same way, from the events the
host passes on to its page (`HeardOrder`): each table's tokens, which tables have ended, the order's
trace so far; the fresh process goes on with it (engine/request_group.py `OrderResume`) and the page
gets a `Restart` event where its timeline marks the restart, instead of an error.

The client's stream keeps its own count: a resumed request's tokens carry on at the index it had
reached, and its first-token time is the one it had (the server's TTFT histogram counts the
resubmission's own, from the moment the fresh engine took it).

Poison orders: a crash is blamed on the requests in the engine that had produced no token since
they were last submitted (a request that crashes its engine at once never streams again; one
still waiting for its turn was not in the engine). A request blamed twice
ends with one line (`poison_line`) and is never submitted again; everyone else is resumed. Requests
blamed once are resubmitted one at a time, each after the previous one has streamed a token, so a
second crash falls on the one that caused it, not on the innocent requests beside it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from engine.events import PrefillStart, Restart, StepEnd, Token
from engine.request_group import OrderResume
from engine.trace import StepRecord
from serving.host import wire

STRIKES = 2  # crashes blamed on one request before it is given up as a poison order


@dataclass
class HeardOrder:
    """A Kitchen order's story as its host passed it on: what a fresh process needs to go on with it."""

    tables: int
    placed_at: float = field(default_factory=time.monotonic)  # the order's clock starts about here
    tokens: list[list[int]] = field(default_factory=list)  # per table
    finished: list[str] = field(default_factory=list)  # per table: "served" once its last token is out
    steps: list[StepRecord] = field(default_factory=list)  # the order's trace: its wok's record, its pot's passes
    started: bool = False  # its PrefillStart has reached the page

    def __post_init__(self):
        self.tokens = [[] for _ in range(self.tables)]
        self.finished = [""] * self.tables

    def fold(self, events: list) -> None:
        for ev in events:
            if isinstance(ev, Token):
                self.tokens[ev.seq].append(ev.token_id)
                if ev.finished:
                    self.finished[ev.seq] = "served"
            elif isinstance(ev, StepEnd):
                self.steps.append(ev.step)
            elif isinstance(ev, PrefillStart):
                self.started = True

    @property
    def clock_s(self) -> float:
        return time.monotonic() - self.placed_at

    def resume(self, restarts: int) -> OrderResume:
        return OrderResume(tuple(map(tuple, self.tokens)), tuple(self.finished), tuple(self.steps), self.clock_s,
                           self.started, restarts)  # fmt: skip


@dataclass
class Resumable:
    """One streaming request, or one Kitchen order, as its host remembers it."""

    submit: wire.Submit | wire.PlaceOrder  # as first sent (no resume)
    streamed: list[int] = field(default_factory=list)  # a request's token ids sent to its client so far
    order: HeardOrder | None = None  # an order's story so far
    fresh: bool = True  # no token since it was last submitted: a crash now is blamed on it
    strikes: int = 0
    restarts: int = 0  # crashes it has outlived
    cancelled: bool = False

    @property
    def served(self) -> int:
        """Tokens its client has had, over every table."""
        return sum(map(len, self.order.tokens)) if self.order is not None else len(self.streamed)

    def again(self) -> wire.Submit | wire.PlaceOrder:
        """The request resubmitted: the tokens still owed, continuing from those streamed."""
        s = self.submit
        if isinstance(s, wire.PlaceOrder):
            return wire.PlaceOrder(s.key, s.prompt_ids, s.max_new_tokens, s.settings, self.order.resume(self.restarts))
        n = len(self.streamed)
        settings = dict(s.settings)
        if settings.get("min_tokens"):
            settings["min_tokens"] = max(0, settings["min_tokens"] - n)
        return wire.Submit(s.key, s.prompt, s.max_new_tokens - n, settings, list(self.streamed))


@dataclass(frozen=True)
class Plan:
    """What a crash means for the requests in flight: resubmit `now` once the fresh loop is ready,
    then the blamed ones one at a time (`Recovery.next_probe`); end `poisoned` with one line; tell
    each order that goes on where its timeline marks the restart (`marks`)."""

    now: list[str]  # keys: each is resubmitted as it is sent (`Recovery.again`), its clock read then
    poisoned: list[str]
    marks: dict[str, Restart] = field(default_factory=dict)  # what each resumed order's page is told


def poison_line(model: str, why: str) -> str:
    return (f"this request was in flight when the engine process for {model} failed twice before it produced "
            f"a token (last: {why}); it is not retried, the kitchen goes on without it")  # fmt: skip


class Recovery:
    """The host's memory of its streaming requests (thread-safe: the reader thread and callers use it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[str, Resumable] = {}
        self._queued: deque[str] = deque()  # blamed once, waiting for the previous one to stream
        self._probing: str | None = None  # the blamed request resubmitted last, not yet past its first token
        self.resumed = 0  # requests resubmitted after a crash
        self.poisoned = 0

    def track(self, m: wire.Submit | wire.PlaceOrder) -> None:
        with self._lock:
            order = HeardOrder(len(m.prompt_ids)) if isinstance(m, wire.PlaceOrder) else None
            self._held[m.key] = Resumable(m, order=order)

    def waiting(self) -> int:
        """Requests blamed once, not yet resubmitted."""
        return len(self._queued)

    def streamed(self, key: str, token_id: int) -> tuple[int, bool]:
        """A token reaches the client: (its index in the client's answer, whether the blamed request
        being probed has just proved itself, so the next one may go)."""
        with self._lock:
            r = self._held.get(key)
            if r is None:
                return -1, False
            r.streamed.append(token_id)
            r.fresh = False
            return len(r.streamed) - 1, self._probing == key

    def heard(self, key: str, events: list) -> bool:
        """An order's events reach its page: whether the blamed order being probed has just proved
        itself (it produced something), so the next may go."""
        with self._lock:
            r = self._held.get(key)
            if r is None or r.order is None:
                return False
            r.order.fold(events)
            r.fresh = False
            return self._probing == key

    def cancel(self, key: str) -> None:
        """A client went away or stopped a table: a resubmission of it is cancelled at once."""
        with self._lock:
            if key in self._held:
                self._held[key].cancelled = True

    def is_cancelled(self, key: str) -> bool:
        r = self._held.get(key)
        return r is not None and r.cancelled

    def drop(self, key: str) -> bool:
        """The request ended (done, refused): forget it. True when it was the probe (the next may go)."""
        with self._lock:
            self._held.pop(key, None)
            if key in self._queued:
                self._queued.remove(key)
            return self._probing == key

    def crashed(self, keys: list[str], why: str) -> Plan:
        """The engine died holding `keys` (`why`, one line): blame the fresh ones; plan their resubmission."""
        with self._lock:
            now, later, poisoned, marks = [], [], [], {}
            for key in keys:
                r = self._held.get(key)
                if r is None:
                    continue
                if r.order is not None:
                    marks[key] = Restart(r.order.clock_s, why, r.served)
                r.strikes += r.fresh and key not in self._queued  # one waiting for its turn was not in the engine
                r.restarts += 1
                if r.strikes >= STRIKES:
                    poisoned.append(key)
                    del self._held[key]
                else:
                    (later if r.strikes else now).append(key)
                    r.fresh = True
            self._queued = deque(later + [k for k in self._queued if k not in keys])
            self._probing = None
            self.resumed += len(now) + len(later)
            self.poisoned += len(poisoned)
            return Plan(now, poisoned, {k: m for k, m in marks.items() if k not in poisoned})

    def again(self, key: str) -> wire.Submit | wire.PlaceOrder | None:
        """The request `key` as the fresh process is sent it now (None if it has ended meanwhile)."""
        with self._lock:
            r = self._held.get(key)
            return r.again() if r is not None else None

    def next_probe(self) -> str | None:
        """The next blamed request to resubmit, alone among the blamed (None when none waits)."""
        with self._lock:
            self._probing = None
            while self._queued:
                key = self._queued.popleft()
                if key in self._held:
                    self._probing = key
                    return key
            return None


__all__ = ["Plan", "Recovery", "Resumable", "poison_line"]
