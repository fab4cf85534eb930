"""The host: one engine in its own process, and every client's way to it, called directly.

`EngineHost` is the host that serving/host/api.py's `Host` describes, in this process. The app's
own kitchens are EngineHosts its pages call directly (serving/http/mounted.py opens them), and the
class server's HTTP routes are an adapter over the same object (serving/http/), so the Kitchen in
the app's process never goes through a web server's state or sends itself a request.

    host = EngineHost("chef", LoopSettings("chef"), caps=Caps())     # starts loading at once
    host.wait_ready(120)
    order = host.check(OrderForm(["ROMEO:"] * 2, 32))                # one round trip to the engine
    for msg in host.order(order): ...                                # {"order": ...}, {"events": [...]}, ...

What the host owns, each checked once, here: the instructor's caps (serving/caps.py) on the token
ids the engine's check returned, and an order's time cap (its stream ends with one line past it).
The engine's own limits are the loop's (engine/request_group.py `shared_check`). What one order may
ask (`limits`) is arithmetic on the kitchen's shape, answered without asking the engine.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict
from typing import Any

from engine.errors import EngineError
from engine.limits import Limits
from engine.request_group import order_room
from serving.caps import Caps
from serving.host.api import CheckedOrder, NotReady, OrderForm, StreamClosed, StreamFailed
from serving.host.handles import PolledHandle, Refused
from serving.host.loop import LoopSettings
from serving.host.process import EngineProcess

ANSWER_S = 60.0  # the longest a check waits for the engine (a Lab sweep in the loop holds it)
WAKE_S = 0.5  # how often a waiting caller checks that the host is still open
COALESCE_S = 0.05  # an order's stream sends what its steps produced this often (one message, not one per step)
SWEEP_POLL_S = 0.1  # a sweep's stream looks for finished points this often


class EngineHost:
    """One model's kitchen: its engine process, caps, class board and metrics."""

    def __init__(self, name: str, settings: LoopSettings, caps: Caps | None = None, metrics=None, board=None,
                 sweeps=None, label: str = "this server's own kitchen"):  # fmt: skip
        """`name`: what clients call the model; `settings`: what the loop loads. `metrics` and
        `board` (serving/http/) follow every step; `sweeps` runs the Lab's experiments (lab/sweeps.py)."""
        self.name, self.settings, self.label = name, settings, label
        self.caps = caps or Caps()
        self.metrics, self.class_board, self.sweeps = metrics, board, sweeps
        self.process: EngineProcess | None = None
        e = settings.engine
        precision = "int8" if e.quant == "int8" else e.dtype
        self.status = f"the kitchen is loading {name} on {e.device} ({precision}); try again in a few seconds"
        self.failed = False
        self.used_at = time.monotonic()
        self._closed = False
        self._loaded = threading.Event()
        threading.Thread(target=self._load, daemon=True, name=f"host-loader-{name}").start()

    def _load(self) -> None:
        try:
            process = EngineProcess(self.settings, self.metrics, self.class_board, self.sweeps)
        except EngineError as err:
            self.status, self.failed = f"the kitchen could not start: {err}", True
        else:
            if self._closed:
                process.close()
            else:
                self.process = process
        self._loaded.set()

    @property
    def ready(self) -> bool:
        return self.process is not None and self.process.ready is not None and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._loaded.wait(timeout)
        return self.ready

    def _process(self) -> EngineProcess:
        """The loaded process; `NotReady` while it loads, `EngineError` when it could not start or closed."""
        self.used_at = time.monotonic()
        if self._closed:
            raise EngineError(f"{self.label} is closed")
        if self.process is None:
            raise EngineError(self.status) if self.failed else NotReady(self.status)
        return self.process

    # -- what clients ask ---------------------------------------------------------------------------------
    def about(self) -> dict:
        """The served model and the kitchen's shape."""
        p = self._process()
        r = p.ready
        return {"name": self.name, "info": asdict(r.model_info), "policy": r.policy, "seats": r.serving.seats,
                "kv_tokens": r.serving.kv_tokens, "token_budget": r.token_budget, "batch_invariant": r.batch_invariant,
                "pid": p.pid, "threads": self.settings.threads}  # fmt: skip

    def limits(self, prompt_tokens: int, max_new_tokens: int) -> Limits:
        """What one order of this shape may ask: tables, context, KV memory."""
        r = self._process().ready
        for name, value in (("prompt_tokens", prompt_tokens), ("max_new_tokens", max_new_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineError(f"{name} must be an integer >= 1 (got {value!r})")
        return order_room(r.serving, r.max_context, r.model_info.kv_bytes_per_token, prompt_tokens, max_new_tokens)

    def check(self, form: OrderForm) -> CheckedOrder:
        """The order's token ids from the engine (its limits), then the instructor's caps on them."""
        ids = self._wait(self._process().check(form), ANSWER_S)
        self.caps.check([len(p) for p in ids], form.max_new_tokens)
        return CheckedOrder(ids, form.max_new_tokens, dict(form.settings))

    def order(self, order: CheckedOrder) -> OrderStream:
        """The checked order joins the batch; its stream tells its story (`OrderStream`)."""
        process = self._process()
        return OrderStream(self, process, process.place_order(order), time.monotonic() + self.caps.max_order_seconds)

    def lab(self, key: str, settings: Any) -> LabStream:
        """An experiment of the Lab's registry, run in the loop between orders (`LabStream`)."""
        process = self._process()
        if self.sweeps is None:
            raise EngineError(f"{self.label} runs no Lab sweeps")
        self.sweeps.check(key, settings)
        return LabStream(self, process, process.run_sweep(key, settings))

    def board(self, order_id: str | None, since: int = -1) -> dict | None:
        return self.class_board.snapshot(order_id, since) if self.class_board is not None else None

    def close(self) -> None:
        self._closed = True  # a caller waiting on the engine wakes within WAKE_S (`_wait`)
        if self.process is not None:
            self.process.close()

    # -- the class's requests (the OpenAI routes) ------------------------------------------------------
    async def submit(self, prompt, max_new_tokens: int, settings: dict):
        return await self._process().submit(prompt, max_new_tokens, settings)

    def cancel(self, key: str) -> None:
        if self.process is not None:
            self.process.cancel(key)

    @property
    def in_flight(self) -> int:
        return self.process.in_flight if self.process is not None else 0

    @property
    def idle(self) -> bool:
        return self.ready and self.in_flight == 0

    def _wait(self, future: Future, timeout_s: float | None) -> Any:
        """The future's result; never waits on a host that closed meanwhile."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return future.result(WAKE_S)
            except FutureTimeout:
                if self._closed:
                    raise EngineError(f"{self.label} is closed") from None
                if deadline is not None and time.monotonic() > deadline:
                    raise EngineError(f"{self.label} did not answer in {timeout_s:.0f} s") from None
            except Refused as err:
                raise EngineError(str(err)) from None


class Stream:
    """News on a polled handle as messages, for a plain thread (iterate) or a coroutine (`messages()`).
    `close()` from any thread cancels the work and wakes a waiting reader at once."""

    POLL_S = COALESCE_S

    def __init__(self, host: EngineHost, process: EngineProcess, handle: PolledHandle):
        self.host, self.process, self.handle = host, process, handle
        self._closed = threading.Event()

    def opening(self, accepted: Any) -> list[dict]:
        return []

    def poll(self) -> tuple[list[dict], bool]:
        """The messages since the last poll, and whether the stream has ended."""
        raise NotImplementedError

    def __iter__(self):
        try:
            yield from self.opening(self.host._wait(self.handle.accepted, None) if self.wants_accepted else None)
            while True:
                if self._closed.wait(self.POLL_S):
                    raise StreamClosed("the stream was closed")
                messages, ended = self.poll()
                yield from messages
                if ended:
                    return
        finally:
            self.cancel()

    async def messages(self):
        """The same messages for a coroutine (a server's route); a failure is raised as `StreamFailed`."""
        try:
            accepted = None
            if self.wants_accepted:
                try:
                    accepted = await asyncio.wrap_future(self.handle.accepted)
                except Refused as err:
                    raise EngineError(str(err)) from None
            for msg in self.opening(accepted):
                yield msg
            while not self._closed.is_set():
                await asyncio.sleep(self.POLL_S)
                messages, ended = self.poll()
                for msg in messages:
                    yield msg
                if ended:
                    return
        finally:
            self.cancel()

    wants_accepted = True

    def cancel(self) -> None:
        if not self.handle.finished:
            self.process.cancel(self.handle.key)

    def close(self) -> None:
        self._closed.set()
        self.cancel()


class OrderStream(Stream):
    """An order's story: {"order": ID, "prompt_tokens": [...]}, then {"events": [engine events]}
    every COALESCE_S while it cooks. Past the instructor's time cap, or if the engine fails, it
    ends with `StreamFailed` (one line); closing it early cancels the order's tables."""

    def __init__(self, host: EngineHost, process: EngineProcess, handle: PolledHandle, deadline: float):
        super().__init__(host, process, handle)
        self.deadline = deadline
        self.order_id = "order-" + secrets.token_hex(12)

    def opening(self, prompt_tokens: list[int]) -> list[dict]:
        if self.host.class_board is not None:  # its tables, named on the class board
            self.host.class_board.order(self.order_id, [f"{self.handle.key}/{i}" for i in range(len(prompt_tokens))])
        return [{"order": self.order_id, "prompt_tokens": prompt_tokens}]

    def poll(self) -> tuple[list[dict], bool]:
        events, end = [], None
        for kind, value in self.handle.drain():
            if kind == "events":
                events += value
            else:
                end = (kind, value)
        out = [{"events": events}] if events else []
        if end is not None:
            if end[0] == "error":
                raise StreamFailed(end[1])
            if end[0] == "cancelled" and not self._closed.is_set():
                raise StreamFailed("the order was cancelled in the kitchen", 500)
            return out, True
        if time.monotonic() > self.deadline:
            self.cancel()
            raise StreamFailed(self.host.caps.time_line(), 408, "timeout_error")
        return out, False


class LabStream(Stream):
    """A sweep's story: {"progress": record} as points finish, then {"result": result}; a failure
    is `StreamFailed` (one line); closing it early cancels the sweep."""

    POLL_S = SWEEP_POLL_S
    wants_accepted = False

    def poll(self) -> tuple[list[dict], bool]:
        out = []
        for kind, value in self.handle.drain():
            if kind == "progress":
                out.append({"progress": value})
            elif kind == "done":
                return [*out, {"result": value}], True
            else:
                raise StreamFailed(value or "the sweep failed")
        return out, False
