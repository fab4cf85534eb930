"""One request's, order's or sweep's news as the host holds it: what the pipe's reader thread puts, per key.

The reader thread (serving/host/process.py) receives the loop's messages and puts each key's news on
its handle. Two kinds of reader take it from there:

    handle = await process.submit("ROMEO:", 16, {"temperature": 0.0})   # an OpenAI request (Handle)
    async for kind, value in handle:      # ("token", Tok) ... then ("done", RequestOutput) or ("error", line)
        ...

    handle = process.place_order(order)   # a Kitchen order or a Lab sweep (PolledHandle)
    handle.accepted.result(60)            # its tables' prompt lengths, or Refused (one line)
    handle.drain()                        # everything put since the last call, on the reader's own schedule

`accepted` is a `concurrent.futures.Future`, so a plain thread waits on it and a coroutine awaits it
(`asyncio.wrap_future`).
"""

from __future__ import annotations

import asyncio
import collections
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from serving.host.wire import StepInfo

ENDS = ("done", "error", "cancelled")


@dataclass(frozen=True)
class Tok:
    token_id: int
    text: str
    index: int  # 0 = the request's first token
    finished: bool
    step: StepInfo | None
    ttft_s: float | None  # on a request's first token: arrival -> this token, measured by the engine process
    logprobs: tuple | None = None  # asked for: (token text, logprob, ((rival text, logprob), ...)), engine-measured


class Refused(EngineError):
    """The engine refused the request (one line naming the limit)."""


class Handle:
    """One request's events for a coroutine: iterate with `async for`; the last is ("done",
    RequestOutput) or ("error", line). Each put wakes the reader (a token streams at once)."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop | None = None):
        self.key, self.loop = key, loop
        self.queue: asyncio.Queue | None = asyncio.Queue() if loop is not None else None
        self.accepted: Future = Future()
        self.prompt_tokens: Any = 0
        self.finished = False

    def put(self, item: tuple[str, Any]) -> None:
        if self.loop is not None:  # a question's handle (a Check) has only its answer, `accepted`
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def settle(self, ok: bool, value: Any) -> None:
        """The loop's answer to the request: accepted (its prompt lengths, or a Check's ids) or refused."""
        if self.accepted.done():
            return
        if ok:
            self.prompt_tokens = value
            self.accepted.set_result(value)
        else:
            self.accepted.set_exception(Refused(value))

    def __aiter__(self):
        return self

    async def __anext__(self) -> tuple[str, Any]:
        if self.finished:
            raise StopAsyncIteration
        kind, value = await self.queue.get()
        self.finished = kind in ENDS
        return kind, value


class PolledHandle(Handle):
    """News its reader drains on its own schedule (`drain()`), instead of being woken for every
    step: the Kitchen's order stream reads every 50 ms, and a wake-up per step (every few ms)
    would cost the server process, whose cores the browser shares with the engine."""

    def __init__(self, key: str):
        super().__init__(key, None)
        self.pending: collections.deque = collections.deque()

    def put(self, item: tuple[str, Any]) -> None:
        self.pending.append(item)  # thread-safe; read by `drain()`

    def drain(self) -> list[tuple[str, Any]]:
        """Everything put since the last call, in order (the last may be its end)."""
        items = []
        while self.pending:
            items.append(self.pending.popleft())
        if items and items[-1][0] in ENDS:
            self.finished = True
        return items
