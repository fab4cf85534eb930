"""The host's side of its engine process: start the loop, hand it work, route its news, restart it.

The loop (serving/host/loop.py) runs in a child process and talks through a pipe
(serving/host/spawn.py: forked from a fork server that has torch loaded on Linux, a fresh
interpreter on macOS and Windows). One reader thread receives the loop's messages and puts each key's news on that key's handle (serving/host/handles.py), so a
caller waits on its handle, never on the pipe:

    process = EngineProcess(LoopSettings("chef"))          # starts the child, waits for Ready
    ids = process.check(OrderForm(["ROMEO:"], 16)).result(60)   # the engine's answer, or Refused
    handle = process.place_order(CheckedOrder(ids, 16, {}))     # the order's news: handle.drain()
    handle = await process.submit("ROMEO:", 16, {"temperature": 0.0})   # one request, token by token
    process.cancel(handle.key)                               # a client that went away

Nothing blocks on the pipe: one writer thread sends every message, so no caller waits on a busy child.

A child that dies, or is stopped as hung by the watchdog (watchdog.py), is replaced by a fresh one;
every request and Kitchen order in flight resumes there from its streamed tokens (recovery.py: no
error, except for a poison one); a question or a sweep in flight ends with one line naming why.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from engine.errors import EngineError
from serving.host import loop, wire
from serving.host.api import CheckedOrder, OrderForm
from serving.host.handles import Handle, PolledHandle, Tok
from serving.host.loop import LoopSettings
from serving.host.recovery import Recovery, poison_line
from serving.host.spawn import RUNNING, start_loop
from serving.host.watchdog import SWEEP_SILENCE_S, Watchdog, hung_line, silence_floor_s, silence_limit_s
from serving.host.wire import QueueState, ReadyInfo, StepInfo, StepNews

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 600.0
STOP_S = 10.0  # how long a closing host waits for its loop to finish before killing it


class EngineProcess:
    def __init__(self, settings: LoopSettings, metrics=None, board=None, sweeps=None):
        """`metrics` (serving/http/metrics.py) and `board` (serving/http/board.py) are told of every
        step and finished request from the reader thread; `sweeps` runs the Lab's experiments in
        the loop (lab/sweeps.py). Blocks until the loop is ready; raises EngineError if it cannot load."""
        self.settings, self.metrics, self.board, self.sweeps = settings, metrics, board, sweeps
        self.ready: ReadyInfo | None = None
        self.last_step: StepInfo | None = None
        self.state = QueueState(0, 0, 0.0)
        self.restarts = 0
        self.sent: collections.Counter = collections.Counter()  # messages sent to the loop, by class name
        self._handles: dict[str, Handle] = {}
        self.recovery = Recovery()
        self._resuming: dict[str, Handle] = {}  # streaming requests and orders waiting for the fresh child
        self.on_end: Callable[[str], None] = lambda key: None  # a streaming request left the engine (serving/http/fair.py)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._keys = itertools.count()
        self._closing = False
        self._heard = time.monotonic()  # the child's last message, or the first request after a quiet spell
        self._longest_step_s = 0.0
        self._silence_floor_s = silence_floor_s()  # read once, at start
        self._hung: str | None = None  # why the watchdog killed the child
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # (connection, bytes), for the writer thread
        self._load_error: str | None = None
        self._plan = None  # the last crash's resubmissions, sent when the fresh child is ready
        self._start()
        RUNNING.add(self)
        threading.Thread(target=self._write, daemon=True, name="engine-process-writer").start()
        threading.Thread(target=self._read, daemon=True, name="engine-process-reader").start()
        Watchdog("engine-process-watchdog", self._limit_s, self._is_hung, self._kill, lambda: self._closing)
        if not self._ready.wait(READY_TIMEOUT_S) or self.ready is None:
            self.close()
            raise EngineError(self._load_error or f"loading {settings.model} took longer than {READY_TIMEOUT_S:.0f} s")

    # -- the child ------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._proc, self._conn = start_loop(loop.main, self.settings, self.sweeps)

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set() and self.ready is not None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True  # once: a second close (at exit, after the host's) finds it done
        RUNNING.discard(self)
        self._send(wire.Stop())
        self._outbox.put(None)  # the writer's last item: the Stop above goes first
        self._proc.join(STOP_S)
        if self._proc.is_alive():  # a loop that does not stop in time is killed
            self._proc.kill()
            self._proc.join(STOP_S)
        self._conn.close()

    # -- work -----------------------------------------------------------------------------------------
    async def submit(self, prompt, max_new_tokens: int, settings: dict) -> Handle:
        """Queue one request, its tokens streamed to a coroutine; raises Refused when the engine says no."""
        handle = Handle(f"r{next(self._keys)}", asyncio.get_running_loop())
        msg = wire.Submit(handle.key, prompt, max_new_tokens, settings)
        self.recovery.track(msg)
        await asyncio.wrap_future(self._queue(msg, handle))
        return handle

    def check(self, form: OrderForm) -> Future:
        """The engine's answer to an order's one question: its token ids (a Future; Refused when it says no)."""
        handle = Handle(f"c{next(self._keys)}")
        return self._queue(wire.Check(handle.key, form), handle)

    def place_order(self, order: CheckedOrder) -> PolledHandle:
        """A checked order's tables join the batch as requests. Its handle holds ("events", [engine
        events]) per step, then ("done", None), ("cancelled", None) or ("error", line); `accepted`
        its tables' prompt lengths, or Refused."""
        handle = PolledHandle(f"o{next(self._keys)}")
        msg = wire.PlaceOrder(handle.key, order.prompt_ids, order.max_new_tokens, order.settings)
        self.recovery.track(msg)  # an order outlives its engine process too
        self._queue(msg, handle)
        return handle

    def run_sweep(self, experiment: str, settings: Any) -> PolledHandle:
        """A Lab sweep in the loop, between orders. Its handle holds ("progress", record) ..., then
        ("done", result) or ("error", line)."""
        handle = PolledHandle(f"s{next(self._keys)}")
        try:
            raw = wire.encode(wire.RunSweep(handle.key, experiment, settings))
        except TypeError as err:  # a setting that is not a registered type
            raise EngineError(f"the sweep's settings cannot travel to the engine process: {err}") from None
        self._queue(raw, handle, wire.RunSweep.__name__)
        return handle

    def _queue(self, msg, handle: Handle, kind: str | None = None) -> Future:
        """Send `msg` for `handle` once the loop is ready (a loop restarting: the new one); never blocks."""
        with self._lock:
            if self._ready.is_set():
                if not self._handles:
                    self._heard = time.monotonic()  # an idle child was silent with nothing to say
                self._handles[handle.key] = handle
                self._send(msg, kind)
                return handle.accepted
        threading.Thread(target=self._queue_when_ready, args=(msg, handle, kind), daemon=True).start()
        return handle.accepted

    def _queue_when_ready(self, msg, handle: Handle, kind: str | None) -> None:
        if self._ready.wait(READY_TIMEOUT_S) and self.ready is not None:
            self._queue(msg, handle, kind)
        else:
            handle.settle(False, f"the engine for {self.settings.model} is not ready after {READY_TIMEOUT_S:.0f} s")

    def cancel(self, key: str) -> None:
        self.recovery.cancel(key)  # a request waiting for its resubmission is cancelled once resubmitted
        with self._lock:
            if key in self._handles:
                self._send(wire.Cancel(key))

    def clear_leftovers(self, origins: list[int]) -> None:
        """Drop the leftovers these engine requests cooked (no answer: the next order finds them gone)."""
        with self._lock:
            if self.ready is not None:
                self._send(wire.ClearLeftovers(tuple(origins)))

    def forget(self, key: str) -> None:
        """A handle whose answer has been read and that expects no more news."""
        with self._lock:
            self._handles.pop(key, None)

    @property
    def in_flight(self) -> int:
        return len(self._handles) + len(self._resuming)

    def holds(self, key: str) -> bool:
        """Whether the engine (or the fresh one, after a crash) still has the request `key`."""
        return key in self._handles or key in self._resuming

    def _send(self, msg, kind: str | None = None) -> None:
        """Queue `msg` (a message, or its bytes already encoded) for the child now running; never blocks."""
        self.sent[kind or type(msg).__name__] += 1
        self._outbox.put((self._conn, msg if isinstance(msg, bytes) else wire.encode(msg)))

    def _write(self) -> None:
        """The one thread that writes to the pipe, in the order the messages were queued. A message
        for a child that has since died goes nowhere: the reader has already failed its request."""
        while (item := self._outbox.get()) is not None:
            conn, raw = item
            try:
                conn.send_bytes(raw)
            except (OSError, ValueError):
                pass  # the reader sees the death and fails every request in flight

    # -- the reader thread ---------------------------------------------------------------------------------
    def handlers(self) -> dict[type, Callable]:
        """The one table the reader dispatches the loop's messages with (serving/host/wire.py)."""
        return {wire.Ready: self._on_ready, wire.LoadError: self._on_load_error,
                wire.Accepted: self._on_accepted, wire.OrderAccepted: self._on_accepted,
                wire.Checked: self._on_checked, wire.Refusal: self._on_refusal, wire.Steps: self._on_steps,
                wire.SweepProgress: self._on_sweep, wire.SweepDone: self._on_sweep}  # fmt: skip

    def _read(self) -> None:
        handlers = self.handlers()
        while True:
            try:
                msg = wire.decode(self._conn.recv_bytes())
            except (EOFError, OSError):
                if self._closing or self._child_died() is False:
                    return
                continue
            self._heard = time.monotonic()
            try:
                if handlers[type(msg)](msg) is False:
                    return
            except Exception:  # a bug in a handler: the reader lives on, or every request would hang
                log.exception("the engine process's message %s was not handled", type(msg).__name__)

    def _on_ready(self, m: wire.Ready) -> None:
        self.ready = m.info
        with self._lock:
            self._ready.set()
            for key in self._plan.now if self._plan is not None else ():
                self._resubmit(key)
            self._plan = None
        self._probe()

    def _on_load_error(self, m: wire.LoadError) -> bool:
        self._load_error = m.line
        self._ready.set()
        return False  # the child exits: stop reading

    def _on_accepted(self, m: wire.Accepted | wire.OrderAccepted) -> None:
        with self._lock:
            handle = self._handles.get(m.key)
        if handle is None:
            return
        if self.board is not None:
            tables = [(m.key, m.prompt_tokens)] if isinstance(m, wire.Accepted) else \
                [(f"{m.key}/{i}", n) for i, n in enumerate(m.prompt_tokens)]  # fmt: skip
            for key, n in tables:
                self.board.arrived(key, n)
        handle.settle(True, m.prompt_tokens)

    def _on_checked(self, m: wire.Checked) -> None:  # the last word on a question
        with self._lock:
            handle = self._handles.pop(m.key, None)
        if handle is not None:
            handle.settle(True, m.prompt_ids)

    def _on_refusal(self, m: wire.Refusal) -> None:
        with self._lock:
            handle = self._handles.pop(m.key, None)
        if handle is not None and handle.accepted.done():  # a resubmission past the engine's limits now
            handle.put(("error", m.line))
        elif handle is not None:
            handle.settle(False, m.line)
        self._ended(m.key)

    def _on_sweep(self, m: wire.SweepProgress | wire.SweepDone) -> None:
        if isinstance(m, wire.SweepProgress):
            handle = self._handles.get(m.key)
            if handle is not None:
                handle.put(("progress", m.record))
            return
        with self._lock:
            handle = self._handles.pop(m.key, None)
        if handle is not None:
            handle.put(("done" if m.ok else "error", m.value))

    def _on_steps(self, m: wire.Steps) -> None:
        for step in m.steps:
            self._deliver(step)

    def _deliver(self, news: StepNews) -> None:
        for key, events, end in news.orders:  # the Kitchen's orders first: their step's events, then their end
            with self._lock:
                handle = self._handles.get(key) if end is None else self._handles.pop(key, None)
            if handle is not None and events:
                handle.put(("events", events))
            if events and self.recovery.heard(key, events):
                self._probe()
            if handle is not None and end is not None:
                handle.put((end, None))
            if end is not None:
                self._ended(key)
        info, state = news.info, news.state
        self.state = state
        if info is not None:
            self.last_step = info
            self._longest_step_s = max(self._longest_step_s, info.seconds)
        if self.metrics is not None:
            self.metrics.observe_state(state)
            if info is not None:
                self.metrics.observe_step(info)
        if self.board is not None:
            self.board.step(info, news.tokens, news.done)
        for key, token_id, text, index, finished, ttft, lp in news.tokens:
            handle = self._handles.get(key)
            answered, probed = self.recovery.streamed(key, token_id)  # a resumed request goes on at its count
            if handle is not None:
                first = ttft if answered == index else None
                handle.put(("token", Tok(token_id, text, max(answered, index), finished, info, first, lp)))
            if probed:
                self._probe()
        for key, result in news.done:
            with self._lock:
                handle = self._handles.pop(key, None)
            if self.metrics is not None:
                self.metrics.observe_done(result)
            if handle is not None:
                handle.put(("done", result))
            self._ended(key)

    # -- recovery (serving/host/recovery.py) ---------------------------------------------------------------
    def _ended(self, key: str) -> None:
        self.on_end(key)
        if self.recovery.drop(key):
            self._probe()

    def _resubmit(self, key: str) -> None:
        """Under the lock: a streaming request or order goes to the fresh child, continuing where it stopped."""
        handle, msg = self._resuming.pop(key, None), self.recovery.again(key)
        if handle is None or msg is None:
            return
        self._handles[key] = handle
        self._send(msg)
        if self.recovery.is_cancelled(key):
            self._send(wire.Cancel(key))

    def _probe(self) -> None:
        """The next request blamed for a crash goes alone (the one before it has streamed a token)."""
        with self._lock:
            if self._ready.is_set() and (key := self.recovery.next_probe()) is not None:
                self._resubmit(key)

    def _child_died(self) -> bool:
        """Keep every streaming request and order for the fresh child (a poison one ends), fail the rest in one
        line, start a fresh child (one that died before it was ever ready: a failed load, no restart)."""
        with self._lock:
            self._ready.clear()
            handles, self._handles = list(self._handles.values()), {}
        self._proc.join()
        code = self._proc.exitcode
        if self.ready is None:
            self._load_error = f"the engine process for {self.settings.model} exited (code {code}) before it was ready"
            self._ready.set()
            return False
        line = self._hung or (f"the engine process for {self.settings.model} stopped (exit code {code}) while "
                              "this request was cooking; the server is starting a new one")  # fmt: skip
        self._hung = None
        streaming = {h.key: h for h in handles if h.key[0] in "ro"} | self._resuming  # requests and orders
        plan = self.recovery.crashed(list(streaming), line)
        poisoned = set(plan.poisoned)
        with self._lock:
            self._plan = plan
            self._resuming = {k: h for k, h in streaming.items() if k not in poisoned}
        for key, mark in plan.marks.items():  # an order's page marks the restart on its timeline
            streaming[key].put(("events", [mark]))
        for handle in [*(streaming[k] for k in poisoned), *(h for h in handles if h.key not in streaming)]:
            why = poison_line(self.settings.model, line) if handle.key in poisoned else line
            handle.settle(False, why)
            handle.put(("error", why))
            self._ended(handle.key)
        self.last_step, self.state = None, QueueState(0, 0, 0.0)
        if self.board is not None:
            self.board.forget_all()
        if self.metrics is not None:
            self.metrics.observe_restart(len(self._resuming), len(poisoned))
            self.metrics.observe_state(self.state)
        self._conn.close()
        self._start()
        self.restarts += 1  # counted once the fresh child has started: whoever sees the count sees its pid
        return True

    # -- the watchdog's questions ----------------------------------------------------------------------
    def _limit_s(self) -> float:
        limit = silence_limit_s(self._longest_step_s, self._silence_floor_s)
        return max(limit, SWEEP_SILENCE_S) if any(key.startswith("s") for key in list(self._handles)) else limit

    def _is_hung(self, limit_s: float) -> bool:
        with self._lock:
            hung = self._ready.is_set() and bool(self._handles) and time.monotonic() - self._heard > limit_s
            if hung:
                self._ready.clear()  # no new request goes to the child being killed
                self._hung = hung_line(self.settings.model, limit_s)
        return hung

    def _kill(self) -> None:
        self._proc.kill()
