"""The server's side of the kitchen loop: start it, hand it orders, route its events, restart it.

One reader thread receives the loop's messages and puts each request's events on that request's
asyncio queue (thread-safely, through the event loop), so an HTTP handler just awaits its queue:

    client = EngineClient(LoopSettings("chef"))          # starts the child, waits for "ready"
    handle = await client.submit("ROMEO:", 16, {"temperature": 0.0})   # raises Refused (one line)
    async for kind, value in handle:                       # ("token", Tok) ... ("done", RequestOutput)
        ...
    client.cancel(handle.key)                              # a client that went away

Nothing here blocks on the pipe: messages to the child go through one writer thread's queue, so
the event loop (and whoever holds the lock) never waits for a child that is busy writing its own
answers; only the writer waits, and the reader keeps draining the other way meanwhile.

If the child dies (killed, out of memory), every request in flight gets ("error", line naming it),
the reader starts a fresh child, and new requests wait for it to be ready. A child that is alive
but silent (a deadlock, a wedged device) is the failure a dead pipe does not show: while anything
is in flight, the watchdog waits for the child's next message at most `silence_limit_s()` and then
kills it, so the same restart follows and the requests in flight are told in one line (`hung_line`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from serving import loop_messages as msgs
from serving.class_board import ClassBoard
from serving.handles import Handle, PolledHandle, Tok
from serving.kitchen_loop import ENTRY_CODE
from serving.loop_messages import SILENCE_ENV, LoopSettings, QueueState, ReadyInfo, StepInfo
from serving.metrics import KitchenMetrics

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 600.0
SILENCE_FLOOR_S = 60.0  # the watchdog never calls a child hung sooner (TWO_POT_SILENCE_S replaces it)
SILENCE_STEPS = 20  # ... nor before this many times the longest step it has measured
SWEEP_SILENCE_S = 600.0  # while a Lab sweep runs: a sweep paces itself, a point may take minutes
WATCH_S = 0.5  # how often the watchdog looks


def silence_limit_s(longest_step_s: float, floor_s: float | None = None) -> float:
    """How long a child with work in flight may send nothing. Every step's events go out within
    50 ms of the step (serving/kitchen_loop.py), and one step processes at most the token budget,
    so a healthy child is silent for one step at most. Example: the chef's longest step 0.4 s:
    max(60, 20 x 0.4) = 60 s."""
    if floor_s is None:
        floor_s = float(os.environ.get(SILENCE_ENV) or SILENCE_FLOOR_S)
    return max(floor_s, SILENCE_STEPS * longest_step_s)


def hung_line(model: str, limit_s: float) -> str:
    """The one line the requests in flight fail with when their child was stopped as hung."""
    return (f"the engine process for {model} sent nothing for {limit_s:,.0f} s (the limit for this order) "
            "and was stopped as hung; the kitchen restarts it for the next order")  # fmt: skip


class EngineClient:
    def __init__(self, settings: LoopSettings, metrics: KitchenMetrics | None = None, board: ClassBoard | None = None):
        """`metrics` and `board` are updated from the reader thread at each step and each finished request."""
        self.settings, self.metrics, self.board = settings, metrics, board
        self.ready: ReadyInfo | None = None
        self.last_step: StepInfo | None = None
        self.state = QueueState(0, 0, 0.0)
        self.restarts = 0
        self._handles: dict[str, Handle] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._keys = itertools.count()
        self._closing = False
        self._heard = time.monotonic()  # the child's last message, or the first request after a quiet spell
        self._longest_step_s = 0.0
        self._silence_floor_s = float(os.environ.get(SILENCE_ENV) or SILENCE_FLOOR_S)  # read once, at start
        self._hung: str | None = None  # why the watchdog killed the child
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # (connection, bytes), for the writer thread
        self._start()
        threading.Thread(target=self._write, daemon=True, name="kitchen-loop-writer").start()
        threading.Thread(target=self._read, daemon=True, name="kitchen-loop-reader").start()
        threading.Thread(target=self._watch, daemon=True, name="kitchen-loop-watchdog").start()
        if not self._ready.wait(READY_TIMEOUT_S) or self.ready is None:
            raise EngineError(self._load_error or f"loading {settings.model} took longer than {READY_TIMEOUT_S:.0f} s")

    # -- the child ------------------------------------------------------------------------------------
    def _start(self) -> None:
        s = self.settings
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when torch loads (engine/__init__.py)
        args = [str(theirs.fileno()), json.dumps(asdict(s))]
        self._proc = subprocess.Popen([sys.executable, "-c", ENTRY_CODE, *args], pass_fds=[theirs.fileno()],
                                      env=env, cwd=REPO, start_new_session=True)  # fmt: skip
        theirs.close()  # only the child holds that end: its death reads as EOF here
        self._conn = Connection(ours.detach())
        self._load_error: str | None = None

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set() and self.ready is not None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        self._closing = True
        self._send(msgs.Stop())
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._outbox.put(None)  # the writer's last item

    # -- requests -------------------------------------------------------------------------------------
    async def submit(self, prompt, max_new_tokens: int, settings: dict) -> Handle:
        """Queue one request in the kitchen; raises Refused when the engine says no."""
        return await self._queue(msgs.Submit(f"r{next(self._keys)}", prompt, max_new_tokens, settings))

    async def submit_order(self, prompts: list, max_new_tokens: int, settings: dict) -> Handle:
        """Queue the Kitchen's order (its tables join the batch as requests); raises Refused.

        Its handle (`PolledHandle.drain()`) holds ("events", [event dicts]) per step (serving/order_wire.py),
        then ("done", None), ("cancelled", None) or ("error", line); `handle.prompt_tokens` is the
        tables' prompt lengths."""
        return await self._queue(msgs.PlaceOrder(f"o{next(self._keys)}", prompts, max_new_tokens, settings), PolledHandle)

    async def ask(self, name: str, *args) -> Any:
        """The shared kitchen's answer to the order form: "limits" (prompt_len, max_new) -> a dict,
        "check" (prompts, max_new, settings) -> token-id lists. Raises Refused with the engine's line."""
        handle = await self._queue(msgs.Ask(f"a{next(self._keys)}", name, args))
        with self._lock:
            self._handles.pop(handle.key, None)
        return handle.prompt_tokens

    async def _queue(self, msg: msgs.Submit | msgs.PlaceOrder | msgs.Ask, kind: type[Handle] = Handle) -> Handle:
        loop = asyncio.get_running_loop()
        key = msg.key
        handle = kind(key, loop)
        while True:  # a child restarting: wait until the new one is ready, then send to it
            if not self._ready.is_set() and not await loop.run_in_executor(None, self._ready.wait, READY_TIMEOUT_S):
                raise EngineError(f"the engine for {self.settings.model} is not ready after {READY_TIMEOUT_S:.0f} s")
            with self._lock:
                if self._ready.is_set():
                    if not self._handles:
                        self._heard = time.monotonic()  # an idle child was silent with nothing to say
                    self._handles[key] = handle
                    self._send(msg)
                    break
        handle.prompt_tokens = await handle.accepted
        return handle

    async def run_sweep(self, run: Callable, settings: Any) -> Handle:
        """A Lab sweep in the loop, between orders: `run(engine, settings, emit)` (serving/loop_messages.py
        `RunSweep`). Its handle holds ("progress", record) ..., then ("done", result) or ("error", line)."""
        loop = asyncio.get_running_loop()
        msg = msgs.RunSweep(f"s{next(self._keys)}", run.__module__, run.__qualname__, settings,
                            tuple(sys.path))  # fmt: skip
        try:
            raw = msgs.encode(msg)
        except TypeError as err:  # a setting that is not one of this project's values
            raise EngineError(f"the sweep's settings cannot travel to the engine process: {err}") from None
        handle = Handle(msg.key, loop)
        if not self._ready.is_set() and not await loop.run_in_executor(None, self._ready.wait, READY_TIMEOUT_S):
            raise EngineError(f"the engine for {self.settings.model} is not ready after {READY_TIMEOUT_S:.0f} s")
        with self._lock:
            self._heard = self._heard if self._handles else time.monotonic()
            self._handles[msg.key] = handle
            self._send(raw)
        return handle

    def cancel(self, key: str) -> None:
        with self._lock:
            if key in self._handles:
                self._send(msgs.Cancel(key))

    @property
    def in_flight(self) -> int:
        return len(self._handles)

    def _send(self, msg) -> None:
        """Queue `msg` (a message, or its bytes already encoded) for the child now running; never blocks."""
        self._outbox.put((self._conn, msg if isinstance(msg, bytes) else msgs.encode(msg)))

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
        """The one table the reader dispatches the loop's messages with (serving/loop_messages.py)."""
        return {msgs.Ready: self._on_ready, msgs.LoadError: self._on_load_error,
                msgs.Accepted: self._on_accepted, msgs.OrderAccepted: self._on_accepted,
                msgs.Refusal: self._on_refusal, msgs.AskReply: self._on_answer, msgs.Steps: self._on_steps,
                msgs.SweepProgress: self._on_sweep, msgs.SweepDone: self._on_sweep}  # fmt: skip

    def _read(self) -> None:
        handlers = self.handlers()
        while True:
            try:
                msg = msgs.decode(self._conn.recv_bytes())
            except (EOFError, OSError):
                if self._closing:
                    return
                self._child_died()
                continue
            self._heard = time.monotonic()
            if handlers[type(msg)](msg) is False:
                return

    def _on_ready(self, m: msgs.Ready) -> None:
        self.ready = m.info
        self._ready.set()

    def _on_load_error(self, m: msgs.LoadError) -> bool:
        self._load_error = m.line
        self._ready.set()
        return False  # the child exits: stop reading

    def _on_accepted(self, m: msgs.Accepted | msgs.OrderAccepted) -> None:
        with self._lock:
            handle = self._handles.get(m.key)
        if handle is None:
            return
        if self.board is not None:
            tables = [(m.key, m.prompt_tokens)] if isinstance(m, msgs.Accepted) else \
                [(f"{m.key}/{i}", n) for i, n in enumerate(m.prompt_tokens)]  # fmt: skip
            for key, n in tables:
                self.board.arrived(key, n)
        handle.settle(True, m.prompt_tokens)

    def _on_refusal(self, m: msgs.Refusal) -> None:
        with self._lock:
            handle = self._handles.pop(m.key, None)
        if handle is not None:
            handle.settle(False, m.line)

    def _on_answer(self, m: msgs.AskReply) -> None:  # the last word on a question: a refused one leaves too
        with self._lock:
            handle = self._handles.pop(m.key, None)
        if handle is not None:
            handle.settle(m.ok, m.value)

    def _on_sweep(self, m: msgs.SweepProgress | msgs.SweepDone) -> None:
        if isinstance(m, msgs.SweepProgress):
            handle = self._handles.get(m.key)
            if handle is not None:
                handle.put(("progress", m.record))
            return
        with self._lock:
            handle = self._handles.pop(m.key, None)
        if handle is not None:
            handle.put(("done" if m.ok else "error", m.value))

    def _on_steps(self, m: msgs.Steps) -> None:
        for step in m.steps:
            self._deliver(*step)

    def _deliver(self, info: StepInfo | None, tokens: list, done: list, state: QueueState, orders: list) -> None:
        for key, events, end in orders:  # the Kitchen's orders first: their step's events, then their end
            with self._lock:
                handle = self._handles.get(key) if end is None else self._handles.pop(key, None)
            if handle is not None and events:
                handle.put(("events", events))
            if handle is not None and end is not None:
                handle.put((end, None))
        self.state = state
        if info is not None:
            self.last_step = info
            self._longest_step_s = max(self._longest_step_s, info.seconds)
        if self.metrics is not None:
            self.metrics.observe_state(state)
            if info is not None:
                self.metrics.observe_step(info)
        if self.board is not None:
            self.board.step(info, tokens, done)
        for key, token_id, text, index, finished, ttft, lp in tokens:
            handle = self._handles.get(key)
            if handle is not None:
                handle.put(("token", Tok(token_id, text, index, finished, info, ttft, lp)))
        for key, result in done:
            with self._lock:
                handle = self._handles.pop(key, None)
            if self.metrics is not None:
                self.metrics.observe_done(result)
            if handle is not None:
                handle.put(("done", result))

    def _child_died(self) -> None:
        """Fail every request in flight in one line, then start a fresh child."""
        with self._lock:
            self._ready.clear()
            handles, self._handles = list(self._handles.values()), {}
        code = self._proc.wait()
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
        self._start()

    def _watch(self) -> None:
        """Kill a child that has work in flight and has sent nothing past its limit; the reader
        then sees the death, tells the requests why (`hung_line`) and starts a fresh child."""
        while not self._closing:
            time.sleep(WATCH_S)
            limit = silence_limit_s(self._longest_step_s, self._silence_floor_s)
            with self._lock:
                if any(key.startswith("s") for key in self._handles):
                    limit = max(limit, SWEEP_SILENCE_S)
                hung = self._ready.is_set() and bool(self._handles) and time.monotonic() - self._heard > limit
                if hung:
                    self._ready.clear()  # no new request goes to the child being killed
                    self._hung = hung_line(self.settings.model, limit)
            if hung:
                self._proc.kill()
