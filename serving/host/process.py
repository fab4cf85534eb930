"""The host's side of its engine process: start the loop, hand it work, route its news, restart it.

The loop (serving/host/loop.py) runs in a child started through `multiprocessing`'s spawn context:
a fresh interpreter and a pipe, the same on Linux, macOS and Windows. One reader thread receives
the loop's messages and puts each key's news on that key's handle (serving/host/handles.py), so a
caller waits on its handle, never on the pipe:

    process = EngineProcess(LoopSettings("chef"))          # starts the child, waits for Ready
    ids = process.check(OrderForm(["ROMEO:"], 16)).result(60)   # the engine's answer, or Refused
    handle = process.place_order(CheckedOrder(ids, 16, {}))     # the order's news: handle.drain()
    handle = await process.submit("ROMEO:", 16, {"temperature": 0.0})   # one request, token by token
    process.cancel(handle.key)                               # a client that went away

Nothing here blocks on the pipe: messages to the child go through one writer thread's queue, so
no caller (and no lock holder) ever waits for a child busy writing its own answers; only the writer
waits, and the reader keeps draining the other way meanwhile.

If the child dies (killed, out of memory), every request in flight gets ("error", line naming it),
the reader starts a fresh child, and new requests wait for it to be ready. A child alive but silent
is stopped by the watchdog (serving/host/watchdog.py), and the same restart follows.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import itertools
import logging
import multiprocessing
import multiprocessing.util  # before the atexit hook below: exit hooks run last-registered first
import os
import queue
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from engine.errors import EngineError
from serving.host import loop, wire
from serving.host.api import CheckedOrder, OrderForm
from serving.host.handles import Handle, PolledHandle, Tok
from serving.host.loop import LoopSettings
from serving.host.watchdog import SWEEP_SILENCE_S, Watchdog, hung_line, silence_floor_s, silence_limit_s
from serving.host.wire import QueueState, ReadyInfo, StepInfo, StepNews

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 600.0
STOP_S = 10.0  # how long a closing host waits for its loop to finish before killing it
SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter, on every OS (no fork, no inherited fds)
_OPEN: weakref.WeakSet = weakref.WeakSet()
_BARE_MAIN = types.ModuleType("__main__")  # no file, no spec: what the child is told the parent's script is
_START_LOCK = threading.Lock()


@contextlib.contextmanager
def bare_main():
    """While a loop starts, the parent's `__main__` is a module without a file. A spawned child runs
    the parent's main script again to rebuild it; here that would be Streamlit's page (Streamlit
    installs each page as `__main__` while it runs), a benchmark script, or stdin. The loop needs none
    of it: its entry and arguments live in this package."""
    with _START_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = _BARE_MAIN
        try:
            yield
        finally:
            if sys.modules.get("__main__") is _BARE_MAIN:
                sys.modules["__main__"] = main


@atexit.register
def _close_all() -> None:
    """At exit, stop every loop still running, before multiprocessing waits for its children."""
    for process in list(_OPEN):
        process.close()


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
        self._start()
        _OPEN.add(self)
        threading.Thread(target=self._write, daemon=True, name="engine-process-writer").start()
        threading.Thread(target=self._read, daemon=True, name="engine-process-reader").start()
        Watchdog("engine-process-watchdog", self._limit_s, self._is_hung, self._kill, lambda: self._closing)
        if not self._ready.wait(READY_TIMEOUT_S) or self.ready is None:
            self.close()
            raise EngineError(self._load_error or f"loading {settings.model} took longer than {READY_TIMEOUT_S:.0f} s")

    # -- the child ------------------------------------------------------------------------------------
    def _start(self) -> None:
        ours, theirs = SPAWN.Pipe(duplex=True)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the child reads it when torch loads (engine/__init__.py)
        self._proc = SPAWN.Process(target=loop.main, args=(theirs, self.settings, self.sweeps), daemon=False,
                                   name=f"engine-loop-{self.settings.model}")  # fmt: skip
        with bare_main():
            self._proc.start()
        theirs.close()  # only the child holds that end: its death reads as EOF here
        self._conn = ours

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set() and self.ready is not None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        _OPEN.discard(self)
        self._send(wire.Stop())
        self._outbox.put(None)  # the writer's last item: the Stop above goes first
        self._proc.join(STOP_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(STOP_S)
        self._conn.close()

    # -- work -----------------------------------------------------------------------------------------
    async def submit(self, prompt, max_new_tokens: int, settings: dict) -> Handle:
        """Queue one request, its tokens streamed to a coroutine; raises Refused when the engine says no."""
        handle = Handle(f"r{next(self._keys)}", asyncio.get_running_loop())
        await asyncio.wrap_future(self._queue(wire.Submit(handle.key, prompt, max_new_tokens, settings), handle))
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
        self._queue(wire.PlaceOrder(handle.key, order.prompt_ids, order.max_new_tokens, order.settings), handle)
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
        with self._lock:
            if key in self._handles:
                self._send(wire.Cancel(key))

    def forget(self, key: str) -> None:
        """A handle whose answer has been read and that expects no more news."""
        with self._lock:
            self._handles.pop(key, None)

    @property
    def in_flight(self) -> int:
        return len(self._handles)

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
        self._ready.set()

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
        if handle is not None:
            handle.settle(False, m.line)

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
            if handle is not None and end is not None:
                handle.put((end, None))
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
            if handle is not None:
                handle.put(("token", Tok(token_id, text, index, finished, info, ttft, lp)))
        for key, result in news.done:
            with self._lock:
                handle = self._handles.pop(key, None)
            if self.metrics is not None:
                self.metrics.observe_done(result)
            if handle is not None:
                handle.put(("done", result))

    def _child_died(self) -> bool:
        """Fail every request in flight in one line, then start a fresh child (a child that died
        before it was ever ready is a load that failed: no restart)."""
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
        for handle in handles:
            handle.settle(False, line)
            handle.put(("error", line))
        self.restarts += 1
        self.last_step, self.state = None, QueueState(0, 0, 0.0)
        if self.board is not None:
            self.board.forget_all()
        if self.metrics is not None:
            self.metrics.observe_state(self.state)
        self._conn.close()
        self._start()
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
