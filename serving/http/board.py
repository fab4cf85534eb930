"""The class board: the whole class's orders in the kitchen, as a student may see them.

A class kitchen cooks every student's order in one continuous batch, so the lesson a student can
watch is the batch itself: tickets joining the pot mid-service, the pot's batch size going up and
down, and their own TTFT and TPOT beside the kitchen's. The board keeps what the kitchen loop
reports after each step (serving/host/loop.py `StepInfo`, with the keys of the requests in it)
and answers `GET /kitchen/board?order=ID&since=N` (serving/http/server.py):

    {"now": 1733..., "last_step": 57, "steps": [{"index": 41, "t": ..., "phase": "decode", "batch": 3, "seconds": ..., "mine": 1,
                              "joined": 0, ...}, ...],                   steps after index N, oldest first
     "tickets": [{"ticket": 7, "mine": true, "state": "running", "prompt_tokens": 12, "tokens": 5}, ...],
     "kitchen": {"finished": 9, "ttft_p50_s": ..., "tpot_p50_s": ...}}   requests finished in the last minute

Privacy: a ticket is a number. The board never sends a prompt, a text or another order's id; an
order's own tickets are marked only for the caller who names that order's id (the `id` of its
stream's chunks, a random string only that client has seen).

Thread-safety: the engine client's reader thread reports steps and arrivals, the server's event
loop registers orders and reads snapshots; one lock guards the board.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from engine.results import RequestOutput
from serving.host.wire import StepInfo

STEPS_KEPT = 4096  # recent steps (at 3 ms a step: a dozen seconds of decode; at 100 ms: minutes)
FINISHED_WINDOW_S = 60.0  # the kitchen's TTFT / TPOT are over the requests finished this recently
TICKETS_SHOWN = 64  # the rail shows at most this many tickets (yours always among them)
ORDERS_KEPT = 1024  # recent orders whose steps their clients can still find after they finish


@dataclass
class BoardEntry:
    """One request on the class board's rail (an order of B tables has B), numbered by arrival: what a student sees."""

    number: int
    key: str
    arrived: float  # wall clock
    prompt_tokens: int
    tokens: int = 0
    state: str = "waiting"  # waiting -> running -> done


@dataclass(frozen=True)
class StepRow:
    index: int  # the board's own count of steps (it goes on across engine restarts)
    t: float  # wall clock at the end of the step
    phase: str
    seconds: float
    batch: int
    prefill_tokens: int
    decode_tokens: int
    kv_bytes: int
    keys: tuple[str, ...]
    joined: int  # requests in their first step


class ClassBoard:
    def __init__(self):
        self._lock = threading.Lock()
        self._tickets: dict[str, BoardEntry] = {}
        self._numbers = self._step_count = 0
        self._steps: deque[StepRow] = deque(maxlen=STEPS_KEPT)
        self._finished: deque[tuple[float, float, float | None]] = deque()  # (wall time, ttft_s, tpot_s)
        self._orders: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    # -- what the kitchen reports (the engine client's reader thread) ------------------------------------------
    def arrived(self, key: str, prompt_tokens: int) -> None:
        with self._lock:
            self._numbers += 1
            self._tickets[key] = BoardEntry(self._numbers, key, time.time(), prompt_tokens)

    def step(self, info: StepInfo | None, tokens: list, done: list[tuple[str, RequestOutput]]) -> None:
        now = time.time()
        with self._lock:
            for key, *_ in tokens:
                if key in self._tickets:
                    self._tickets[key].tokens += 1
            if info is not None:
                joined = 0
                for key in info.keys:
                    ticket = self._tickets.get(key)
                    if ticket is not None and ticket.state == "waiting":
                        ticket.state, joined = "running", joined + 1
                self._step_count += 1
                self._steps.append(StepRow(self._step_count, info.wall_t or now, info.phase, info.seconds, info.batch,
                                           info.prefill_tokens, info.decode_tokens, info.kv_bytes, info.keys,
                                           joined))  # fmt: skip
            for key, result in done:
                self._tickets.pop(key, None)
                m = result.metrics
                if result.finish_reason != "cancelled" and m is not None and m.output_tokens:
                    self._finished.append((now, m.ttft_s, m.tpot_s))
            while self._finished and self._finished[0][0] < now - FINISHED_WINDOW_S:
                self._finished.popleft()

    def forget_all(self) -> None:
        """The engine process died: nothing it held is cooking any more."""
        with self._lock:
            self._tickets.clear()

    # -- what the server does -----------------------------------------------------------------------------------
    def order(self, order_id: str, keys: list[str]) -> None:
        """Name an order's tickets (its tables) so its client can find them."""
        with self._lock:
            self._orders[order_id] = tuple(keys)
            while len(self._orders) > ORDERS_KEPT:
                self._orders.popitem(last=False)

    def snapshot(self, order_id: str | None = None, since: int = -1) -> dict:
        """The board for the client of `order_id` (None: every ticket anonymous), steps after `since`."""
        now = time.time()
        with self._lock:
            mine = set(self._orders.get(order_id, ())) if order_id else set()
            steps = [s for s in self._steps if s.index > since]
            tickets = sorted(self._tickets.values(), key=lambda t: t.number)
            finished = [f for f in self._finished if f[0] >= now - FINISHED_WINDOW_S]
            last = self._step_count
        shown = [t for t in tickets if t.key in mine] + [t for t in tickets if t.key not in mine]
        shown = sorted(shown[:TICKETS_SHOWN], key=lambda t: t.number)
        ttfts = [f[1] for f in finished]
        tpots = [f[2] for f in finished if f[2] is not None]
        return {
            "now": now,
            "last_step": last,
            "steps": [{
                "index": s.index, "t": s.t, "phase": s.phase, "seconds": s.seconds, "batch": s.batch,
                "prefill_tokens": s.prefill_tokens, "decode_tokens": s.decode_tokens, "kv_bytes": s.kv_bytes,
                "mine": sum(k in mine for k in s.keys), "joined": s.joined,
            } for s in steps],  # fmt: skip
            "tickets": [{
                "ticket": t.number, "mine": t.key in mine, "state": t.state, "prompt_tokens": t.prompt_tokens,
                "tokens": t.tokens, "waited_s": now - t.arrived if t.state == "waiting" else None,
            } for t in shown],  # fmt: skip
            "in_kitchen": len(tickets),
            "kitchen": {
                "finished": len(finished),
                "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
                "tpot_p50_s": statistics.median(tpots) if tpots else None,
            },
        }
