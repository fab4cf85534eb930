"""The Kitchen's own routes on the class kitchen server: one order of B tables, every engine event.

The OpenAI routes give a client text and timings; the Kitchen page needs the order's whole story
(the wok's pass, the KV handed over, a bowl per table per step, the trace and the metrics) to draw
it and to diagnose it. These routes give exactly that, for an order whose tables join the same
continuous batch as every student's request (engine/request_group.py), so the page that follows
your order shows the class's dinner rush inside it:

    GET  /kitchen/model                   the served model (engine.loader.ModelInfo as JSON), the
                                          kitchen's policy, seats and token budget, its process id
    POST /kitchen/limits   {"prompt_tokens": 100, "max_new_tokens": 64}
                                          what one order may ask: tables, context, KV memory
    POST /kitchen/check    {"prompts": [...], "max_new_tokens": 64, "temperature": 0}
                                          {"prompt_ids": [[...], ...]} or a 400 with the engine's line
    POST /kitchen/orders   {"model": "chef", "prompts": ["ROMEO:", [1, 2, 3]], "max_new_tokens": 64,
                            "temperature": 0.8, "seed": 0, "reuse_prefix": false}
                                          server-sent events: {"order": ID, "prompt_tokens": [...]}, then
                                          {"events": [...]}: the order's engine events of the steps
                                          of the last 50 ms at most (serving/order_wire.py), then [DONE];
                                          a failure mid-order is one {"error": {...}} event

Refusals before the stream starts are HTTP errors with one line, as on the OpenAI routes: 400 over
a limit (the engine's or the instructor's caps), 404 another model, 422 a malformed field, 503 with
Retry-After past the queue bound (its tables count as requests; serving/admission.py). A
client that hangs up cancels the order's tables at the next step; an order past the instructor's
time limit is cancelled and its stream ends with an error event.

The routes are a thin layer over `about`, `limits_of`, `check_of`, `place` and `messages`, which
know nothing of HTTP: the app's own process calls those directly through `LocalHost` below (one
of serving/host.py's two `KitchenHost`s), so a Kitchen in the same process as its kitchen never
sends an HTTP request to itself.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.errors import EngineError
from serving.handles import PolledHandle, Refused
from serving.host import StreamClosed, checked
from serving.openai_api import ApiError, _field, sse

MAX_TABLES = 64  # the Kitchen's batch slider stops here too
# The stream sends what the order's steps produced every this often (one message, not one per
# step): the page reads it twice a second, and every time shown was measured by the engine,
# so the wait changes no number.
COALESCE_S = 0.05
WAKE_S = 0.5  # how often a thread waiting on the in-process host checks that the host is still open


@dataclass
class PlacedOrder:
    """An order the kitchen accepted: its engine handle, its id on the class board, its deadline."""

    handle: PolledHandle
    order_id: str
    deadline: float  # time.monotonic() past which it is cancelled (the instructor's time cap)


class KitchenOrders:
    def __init__(self, kitchen):
        """`kitchen`: serving.kitchen_http.Kitchen (its engine client, config, body reader and queue bound)."""
        self.kitchen, self.client, self.config = kitchen, kitchen.client, kitchen.config

    def routes(self) -> list[Route]:
        return [
            Route("/kitchen/model", self.model, methods=["GET"]),
            Route("/kitchen/limits", self.limits, methods=["POST"]),
            Route("/kitchen/check", self.check, methods=["POST"]),
            Route("/kitchen/orders", self.orders, methods=["POST"]),
        ]

    # -- the kitchen's answers, without HTTP (ApiError carries the status a route would send) ---------------
    def about(self) -> dict:
        """The served model and the kitchen's shape (what GET /kitchen/model answers)."""
        ready = self.client.ready
        return {"name": self.config.served_name, "info": ready.model_info, "policy": ready.policy,
                "seats": ready.seats, "kv_tokens": ready.kv_tokens, "token_budget": ready.token_budget,
                "batch_invariant": ready.batch_invariant, "pid": self.client.pid, "threads": self.client.settings.threads}  # fmt: skip

    async def limits_of(self, body: dict) -> dict:
        prompt = _field(body, "prompt_tokens", int, 1, check=lambda v: v >= 1, rule="an integer >= 1")
        max_new = _field(body, "max_new_tokens", int, 1, check=lambda v: v >= 1, rule="an integer >= 1")
        return await self._ask("limits", prompt, max_new)

    async def check_of(self, body: dict) -> dict:
        prompts, max_new, settings = self._parse(body)
        return {"prompt_ids": await self._ask("check", prompts, max_new, settings)}

    async def place(self, body: dict) -> PlacedOrder:
        """Validate an order, check the caps, seat its tables in the batch and name it on the board."""
        model = _field(body, "model", str, rule="the name of a served model (GET /v1/models)")
        if model is None:  # the Kitchen page always names it: an order without one is a broken client
            raise ApiError(422, "field 'model' is required: the name of a served model (GET /v1/models)", "model")
        self.kitchen.served(model)
        prompts, max_new, settings = self._parse(body)
        caps = self.config.caps
        try:
            caps.check([1] * len(prompts), max_new)
            self.kitchen.admission.admit(len(prompts))
            handle = await self.client.submit_order(prompts, max_new, settings)
        except Refused as err:
            raise ApiError(400, str(err), "prompts") from None
        except EngineError as err:  # the instructor's caps, or an engine that is not ready
            status = 503 if "not ready" in str(err) else 400
            raise ApiError(status, str(err), None if status == 503 else "max_new_tokens") from None
        try:
            caps.check(handle.prompt_tokens, max_new)
        except EngineError as err:
            self.client.cancel(handle.key)
            raise ApiError(400, str(err), "prompts") from None
        order_id = "order-" + secrets.token_hex(12)
        if self.client.board is not None:
            self.client.board.order(order_id, [f"{handle.key}/{i}" for i in range(len(prompts))])
        return PlacedOrder(handle, order_id, time.monotonic() + caps.max_order_seconds)

    def cancel(self, placed: PlacedOrder) -> None:
        if not placed.handle.finished:
            self.client.cancel(placed.handle.key)

    async def messages(self, placed: PlacedOrder) -> AsyncIterator[dict]:
        """The order's story: {"order": ID, "prompt_tokens": [...]}, then {"events": [...]} every
        COALESCE_S while it cooks; a failure or the time cap ends it with one {"error": {...}}.
        Closing the iterator early cancels the order's tables."""
        handle = placed.handle
        try:
            yield {"order": placed.order_id, "prompt_tokens": handle.prompt_tokens}
            while True:
                await asyncio.sleep(COALESCE_S)
                events, end = [], None
                for kind, value in handle.drain():
                    if kind == "events":
                        events += value
                    else:
                        end = (kind, value)
                if events:
                    yield {"events": events}
                if end is not None:
                    if end[0] == "error":
                        yield ApiError(500, end[1], kind="engine_error").body()
                    break  # "done", an error, or "cancelled" (only after the client has gone)
                if time.monotonic() > placed.deadline:
                    yield ApiError(408, self.config.caps.time_line(), kind="timeout_error").body()
                    break
        finally:
            self.cancel(placed)

    # -- the routes -------------------------------------------------------------------------------------------
    async def model(self, request: Request) -> Response:
        return JSONResponse(self.about())

    async def limits(self, request: Request) -> Response:
        return JSONResponse(await self.limits_of(await self._body(request)))

    async def check(self, request: Request) -> Response:
        return JSONResponse(await self.check_of(await self._body(request)))

    async def orders(self, request: Request) -> Response:
        placed = await self.place(await self._body(request))
        stream = sse_stream(request, self.messages(placed), lambda: self.cancel(placed))
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # -- parsing ---------------------------------------------------------------------------------------------
    async def _body(self, request: Request) -> dict:
        body = await self.kitchen._json(request)
        if not isinstance(body, dict):
            raise ApiError(422, "the body must be a JSON object")
        return body

    @staticmethod
    def _parse(body: dict) -> tuple[list, int, dict]:
        rule = f"a list of 1 to {MAX_TABLES} prompts, each text or a list of token ids"
        prompts = _field(body, "prompts", list, rule=rule, check=lambda v: 1 <= len(v) <= MAX_TABLES and all(
            (isinstance(p, str) and p.strip()) or (isinstance(p, list) and p and all(
                isinstance(t, int) and not isinstance(t, bool) for t in p)) for p in v))  # fmt: skip
        if prompts is None:
            raise ApiError(422, f"field 'prompts' is required: {rule}", "prompts")
        max_new = _field(body, "max_new_tokens", int, 16, check=lambda v: v >= 1, rule="an integer >= 1")
        temperature = float(_field(body, "temperature", (int, float), 0.0, check=lambda v: 0 <= v <= 2,
                                   rule="between 0 and 2"))  # fmt: skip
        seed = _field(body, "seed", int, 0, rule="an integer")
        # A Kitchen order cooks every prompt token it draws unless it asks to reuse leftovers.
        reuse = _field(body, "reuse_prefix", bool, False, rule="true or false")
        return prompts, max_new, {"temperature": temperature, "seed": seed, "reuse_prefix": reuse}

    async def _ask(self, name: str, *args):
        try:
            return await self.client.ask(name, *args)
        except Refused as err:
            raise ApiError(400, str(err), "prompts" if name == "check" else None) from None
        except EngineError as err:
            raise ApiError(503, str(err), kind="server_error") from None


async def sse_stream(request: Request, messages: AsyncIterator, on_hang_up: Callable[[], None],
                     encode: Callable = lambda m: m):  # fmt: skip
    """`messages` as server-sent events, then [DONE]; a client that hangs up calls `on_hang_up` at once
    (the http.disconnect on receive()), and the messages are closed either way."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        on_hang_up()

    watcher = asyncio.create_task(watch())
    try:
        async for msg in messages:
            yield sse(encode(msg))
        yield sse("[DONE]")
    finally:
        watcher.cancel()
        await messages.aclose()


# -- the host in this process: these routes' code, called directly ------------------------------------------


class LocalHost:
    """A host in this process. `find()` returns its app (serving/server.py `create_app`), raising
    `NotReady` while it loads and `EngineError` when it cannot start (serving/mounted.py)."""

    def __init__(self, find: Callable[[], Any], label: str = "this server's own kitchen"):
        self._find, self.label = find, label
        self._closed = False
        self._loop = asyncio.new_event_loop()  # the engine client's handles wake on it
        threading.Thread(target=self._loop.run_forever, daemon=True, name="local-host").start()

    def _desk(self) -> KitchenOrders:
        return KitchenOrders(self._find().state.kitchen)

    def _call(self, coro: Awaitable, timeout_s: float | None = 60.0) -> Any:
        if self._closed:
            coro.close()
            raise EngineError(f"{self.label} is closed")
        return self._wait(asyncio.run_coroutine_threadsafe(coro, self._loop), timeout_s)

    def _wait(self, future: Future, timeout_s: float | None) -> Any:
        """The future's result; never waits on a host that closed meanwhile (its loop runs no more)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return future.result(WAKE_S)
            except TimeoutError:
                if self._closed or (deadline is not None and time.monotonic() > deadline):
                    future.cancel()
                    raise EngineError(f"{self.label} did not answer in time" if not self._closed else
                                      f"{self.label} is closed") from None  # fmt: skip
            except ApiError as err:
                raise EngineError(err.message) from None

    def about(self) -> dict:
        return self._desk().about()

    def limits(self, prompt_tokens: int, max_new_tokens: int) -> dict:
        return self._call(self._desk().limits_of({"prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens}))

    def check(self, body: dict) -> list[list[int]]:
        return self._call(self._desk().check_of(body))["prompt_ids"]

    def order(self, body: dict) -> LocalStream:
        async def start() -> tuple[AsyncIterator, Callable[[], None]]:
            desk = self._desk()
            placed = await desk.place(body)
            return desk.messages(placed), lambda: desk.cancel(placed)

        return LocalStream(self, start)

    def lab(self, key: str, settings: Any, run: Callable | None = None) -> LocalStream:
        """`run`: the experiment's run function, when it is not the registry's (a page's own; in process only)."""

        async def start() -> tuple[AsyncIterator, Callable[[], None]]:
            lab = next((x for x in self._find().state.extensions if hasattr(x, "start")), None)
            if lab is None:
                raise EngineError(f"{self.label} runs no Lab sweeps")
            handle = await lab.start(key, settings, run)
            return lab.messages(handle), lambda: lab.cancel(handle)

        return LocalStream(self, start)

    def board(self, order_id: str | None, since: int = -1) -> dict | None:
        try:
            board = self._find().state.kitchen.client.board
        except EngineError:
            return None
        return board.snapshot(order_id, since) if board is not None else None

    def close(self) -> None:
        self._closed = True  # a caller waiting on the loop wakes within WAKE_S (`_wait`)
        self._loop.call_soon_threadsafe(self._loop.stop)


_END = object()


async def _next(messages: AsyncIterator) -> Any:
    try:
        return await messages.__anext__()
    except StopAsyncIteration:
        return _END


class LocalStream:
    """A host's async messages, read from a plain thread; `close()` wakes that reader at once."""

    def __init__(self, host: LocalHost, start: Callable[[], Awaitable[tuple[AsyncIterator, Callable[[], None]]]]):
        self._host, self._start = host, start
        self._lock = threading.Lock()
        self._closed = False
        self._pending = None  # the future of the message being waited for
        self._cancel: Callable[[], None] | None = None

    def __iter__(self) -> Iterator[dict]:
        messages, self._cancel = self._host._call(self._start(), None)
        try:
            while True:
                with self._lock:
                    if self._closed:
                        raise StreamClosed("the stream was closed")
                    self._pending = asyncio.run_coroutine_threadsafe(_next(messages), self._host._loop)
                try:
                    msg = self._host._wait(self._pending, None)
                except CancelledError:
                    raise StreamClosed("the stream was closed") from None
                if msg is _END:
                    return
                yield checked(msg)
        finally:
            if self._closed:  # closed while it was being placed: its `close()` found nothing to cancel yet
                self._cancel()
            asyncio.run_coroutine_threadsafe(messages.aclose(), self._host._loop)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._pending is not None:
                self._pending.cancel()  # the message's task is cancelled: the messages' `finally` cancels
        if self._cancel is not None:
            self._cancel()
