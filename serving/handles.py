"""One request's events as the server awaits them: what the engine client's reader thread puts, per request.

The reader thread (serving/engine_client.py) receives the kitchen loop's messages and puts each
request's events on that request's handle; an HTTP handler awaits the handle:

    handle = await client.submit("ROMEO:", 16, {"temperature": 0.0})   # raises Refused (one line)
    async for kind, value in handle:      # ("token", Tok) ... then ("done", RequestOutput) or ("error", line)
        ...

A Kitchen order's handle (`PolledHandle`) is drained by its page's stream on its own schedule.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from serving.loop_messages import StepInfo


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
    """One request's events: iterate with `async for`; the last is ("done", RequestOutput) or
    ("error", line)."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop):
        self.key, self.loop, self.queue = key, loop, asyncio.Queue()
        self.accepted: asyncio.Future = loop.create_future()
        self.prompt_tokens = 0
        self.finished = False

    def put(self, item: tuple[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def settle(self, ok: bool, value: Any) -> None:
        def set_result() -> None:
            if not self.accepted.done():
                if ok:
                    self.accepted.set_result(value)
                else:
                    self.accepted.set_exception(Refused(value))

        self.loop.call_soon_threadsafe(set_result)

    def __aiter__(self):
        return self

    async def __anext__(self) -> tuple[str, Any]:
        if self.finished:
            raise StopAsyncIteration
        kind, value = await self.queue.get()
        self.finished = kind in ("done", "error", "cancelled")
        return kind, value


class PolledHandle(Handle):
    """An order's handle that its reader drains on its own schedule (`drain()`), instead of being
    woken for every step: the Kitchen's stream sends a message every 50 ms, and a wake-up per step
    (every few ms) would cost the server process, whose cores the browser shares with the engine."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop):
        super().__init__(key, loop)
        self.pending: collections.deque = collections.deque()

    def put(self, item: tuple[str, Any]) -> None:
        self.pending.append(item)  # thread-safe; read by `drain()` on the event loop

    def drain(self) -> list[tuple[str, Any]]:
        """Everything put since the last call, in order (the last may be its end)."""
        items = []
        while self.pending:
            items.append(self.pending.popleft())
        if items and items[-1][0] in ("done", "error", "cancelled"):
            self.finished = True
        return items
