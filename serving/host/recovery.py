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

The client's stream keeps its own count: a resumed request's tokens carry on at the index it had
reached, and its first-token time is the one it had (the server's TTFT histogram counts the
resubmission's own, from the moment the fresh engine took it).

Poison orders: a crash is blamed on the requests that had produced no token since they were last
submitted (a request that crashes its engine at once never streams again). A request blamed twice
ends with one line (`poison_line`) and is never submitted again; everyone else is resumed. Requests
blamed once are resubmitted one at a time, each after the previous one has streamed a token, so a
second crash falls on the one that caused it, not on the innocent requests beside it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from serving.host import wire

STRIKES = 2  # crashes blamed on one request before it is given up as a poison order


@dataclass
class Resumable:
    """One streaming request as its host remembers it."""

    submit: wire.Submit  # as first sent (no resume)
    streamed: list[int] = field(default_factory=list)  # token ids sent to the client so far
    fresh: bool = True  # no token since it was last submitted: a crash now is blamed on it
    strikes: int = 0
    cancelled: bool = False

    def again(self) -> wire.Submit:
        """The request resubmitted: the tokens still owed, continuing from those streamed."""
        s, n = self.submit, len(self.streamed)
        settings = dict(s.settings)
        if settings.get("min_tokens"):
            settings["min_tokens"] = max(0, settings["min_tokens"] - n)
        return wire.Submit(s.key, s.prompt, s.max_new_tokens - n, settings, list(self.streamed))


@dataclass(frozen=True)
class Plan:
    """What a crash means for the requests in flight: resubmit `now` once the fresh loop is ready,
    then the blamed ones one at a time (`Recovery.next_probe`); end `poisoned` with one line."""

    now: list[wire.Submit]
    poisoned: list[str]


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

    def track(self, m: wire.Submit) -> None:
        with self._lock:
            self._held[m.key] = Resumable(m)

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

    def crashed(self, keys: list[str]) -> Plan:
        """The engine died holding `keys`: blame the fresh ones; plan their resubmission."""
        with self._lock:
            now, later, poisoned = [], [], []
            for key in keys:
                r = self._held.get(key)
                if r is None:
                    continue
                r.strikes += r.fresh
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
            return Plan([self._held[k].again() for k in now], poisoned)

    def next_probe(self) -> wire.Submit | None:
        """The next blamed request to resubmit, alone among the blamed (None when none waits)."""
        with self._lock:
            self._probing = None
            while self._queued:
                key = self._queued.popleft()
                r = self._held.get(key)
                if r is not None:
                    self._probing = key
                    return r.again()
            return None


__all__ = ["Plan", "Recovery", "Resumable", "poison_line"]
