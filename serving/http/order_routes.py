"""The Kitchen's and the Lab's routes on a kitchen server: the host's own calls, over HTTP.

The OpenAI routes give a client text and timings; the Kitchen page needs an order's whole story
(the wok's pass, the KV handed over, a bowl per table per step, the trace and the metrics) to draw
and diagnose it, and the Lab runs its sweeps in the server's engine process. These routes are
the host's interface (serving/host/api.py) for a client in another process (serving/clients/remote.py):

    GET  /kitchen/model                   the served model (ModelInfo), the kitchen's shape, its pid
    POST /kitchen/limits   {"prompt_tokens": 100, "max_new_tokens": 64}
                                          what one order may ask: tables, context, KV memory
    POST /kitchen/check    an order       {"prompt_ids": [[...], ...]} or a 400 with the engine's line
    POST /kitchen/orders   an order       server-sent events: {"order": ID, "prompt_tokens": [...]}, then
                                          {"events": [...]} (the order's engine events of the last
                                          50 ms, serving/host/wire.py's JSON), then [DONE]; a failure
                                          mid-order is one {"error": {...}} event
    POST /kitchen/lab/{key} {"settings": <the experiment's settings, serving/host/wire.py's JSON>}
                                          server-sent events: {"progress": ...}, then {"result": ...}

An order is `{"prompts": ["ROMEO:", [1, 2, 3]], "max_new_tokens": 64, "temperature": 0.8, "seed": 0,
"reuse_prefix": false, "model": "chef"}`, or generated prompts: `{"filler": TEXT, "tables": 4,
"prompt_tokens": 32, ...}` (serving/host/api.py `OrderForm`). It is checked once, by the host:
the engine's limits, then the instructor's caps.

Refusals before a stream starts are HTTP errors with one line, as on the OpenAI routes: 400 over
a limit (the engine's or the instructor's caps), 404 another model or an unknown experiment, 422 a
malformed field, 503 with Retry-After past the queue bound (its tables count as requests;
serving/http/admission.py). A client that hangs up cancels its order or sweep at the next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.errors import EngineError
from serving.host.api import ORDER_KEYS, NotReady, OrderForm, StreamFailed
from serving.host.wire import from_json, to_json
from serving.http.openai_api import ApiError, _field, sse

MAX_TABLES = 64  # the Kitchen's batch slider stops here too


class OrderRoutes:
    def __init__(self, routes):
        """`routes`: serving/http/openai_routes.py `OpenAIRoutes` (its host, config, body reader and queue bound)."""
        self.api, self.host = routes, routes.host

    def routes(self) -> list[Route]:
        return [
            Route("/kitchen/model", self.model, methods=["GET"]),
            Route("/kitchen/limits", self.limits, methods=["POST"]),
            Route("/kitchen/check", self.check, methods=["POST"]),
            Route("/kitchen/orders", self.orders, methods=["POST"]),
            Route("/kitchen/lab/{key}", self.lab, methods=["POST"]),
        ]

    async def model(self, request: Request) -> Response:
        return JSONResponse(self.host.about())

    async def limits(self, request: Request) -> Response:
        body = await self._body(request)
        prompt = _field(body, "prompt_tokens", int, 1, check=lambda v: v >= 1, rule="an integer >= 1")
        max_new = _field(body, "max_new_tokens", int, 1, check=lambda v: v >= 1, rule="an integer >= 1")
        return JSONResponse(asdict(self.host.limits(prompt, max_new)))

    async def check(self, request: Request) -> Response:
        order = await self._checked(await self._body(request))
        return JSONResponse({"prompt_ids": order.prompt_ids})

    async def orders(self, request: Request) -> Response:
        body = await self._body(request)
        model = _field(body, "model", str, rule="the name of a served model (GET /v1/models)")
        if model is None:  # the Kitchen page always names it: an order without one is a broken client
            raise ApiError(422, "field 'model' is required: the name of a served model (GET /v1/models)", "model")
        self.api.served(model)
        form = self.form(body)
        self.api.admission.admit(form.tables or len(form.prompts))
        stream = self.host.order(await self._checked(form))
        messages = stream.messages()
        try:
            first = await anext(messages)  # the order seated, or the engine's refusal as a 400
        except EngineError as err:
            raise ApiError(400, str(err), "prompts") from None
        return sse_response(request, first_then(first, messages), stream.close)

    async def lab(self, request: Request) -> Response:
        key = request.path_params["key"]
        body = await self._body(request)
        if "settings" not in body:
            raise ApiError(422, "field 'settings' is required: the experiment's settings", "settings")
        try:
            settings = from_json(body["settings"])
        except (ValueError, TypeError) as err:
            raise ApiError(422, f"field 'settings' cannot be read: {err}", "settings") from None
        try:
            stream = self.host.lab(key, settings)
        except EngineError as err:
            status = 404 if str(err).startswith("no lab experiment") else 422
            raise ApiError(status, str(err), "settings", "not_found_error" if status == 404 else "invalid_request_error") from None
        return sse_response(request, stream.messages(), stream.close)

    # -- parsing ---------------------------------------------------------------------------------------------
    async def _body(self, request: Request) -> dict:
        body = await self.api._json(request)
        if not isinstance(body, dict):
            raise ApiError(422, "the body must be a JSON object")
        return body

    async def _checked(self, form_or_body):
        form = form_or_body if isinstance(form_or_body, OrderForm) else self.form(form_or_body)
        try:
            return await asyncio.to_thread(self.host.check, form)
        except NotReady as err:
            raise ApiError(503, str(err), kind="server_error") from None
        except EngineError as err:  # the engine's limits or the instructor's caps
            raise ApiError(400, str(err), "prompts") from None

    @staticmethod
    def form(body: dict) -> OrderForm:
        """An order's JSON as an `OrderForm`; a malformed field is a 422 naming it."""
        max_new = _field(body, "max_new_tokens", int, 16, check=lambda v: v >= 1, rule="an integer >= 1")
        temperature = float(_field(body, "temperature", (int, float), 0.0, check=lambda v: 0 <= v <= 2,
                                   rule="between 0 and 2"))  # fmt: skip
        seed = _field(body, "seed", int, 0, rule="an integer")
        # A Kitchen order cooks every prompt token it draws unless it asks to reuse leftovers.
        reuse = _field(body, "reuse_prefix", bool, False, rule="true or false")
        settings = dict(zip(ORDER_KEYS, (temperature, seed, reuse), strict=True))
        filler = _field(body, "filler", str, rule="the text generated prompts are cut from")
        if filler is not None:
            rule = f"an integer 1..{MAX_TABLES}"
            tables = _field(body, "tables", int, 1, check=lambda v: 1 <= v <= MAX_TABLES, rule=rule)
            n = _field(body, "prompt_tokens", int, 1, check=lambda v: v >= 1, rule="an integer >= 1")
            return OrderForm([], max_new, settings, filler, tables, n)
        rule = f"a list of 1 to {MAX_TABLES} prompts, each text or a list of token ids"
        prompts = _field(body, "prompts", list, rule=rule, check=lambda v: 1 <= len(v) <= MAX_TABLES and all(
            (isinstance(p, str) and p.strip()) or (isinstance(p, list) and p and all(
                isinstance(t, int) and not isinstance(t, bool) for t in p)) for p in v))  # fmt: skip
        if prompts is None:
            raise ApiError(422, f"field 'prompts' is required: {rule}", "prompts")
        return OrderForm(prompts, max_new, settings)


async def first_then(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for msg in rest:
        yield msg


def sse_response(request: Request, messages: AsyncIterator, on_hang_up: Callable[[], None]) -> StreamingResponse:
    stream = sse_stream(request, messages, on_hang_up)
    return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def sse_stream(request: Request, messages: AsyncIterator, on_hang_up: Callable[[], None]):
    """`messages` as server-sent events (serving/host/wire.py's JSON), then [DONE]; a failure is one
    error event; a client that hangs up calls `on_hang_up` at once (the http.disconnect on
    receive()), and the messages are closed either way."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        on_hang_up()

    watcher = asyncio.create_task(watch())
    try:
        try:
            async for msg in messages:
                yield sse(wire_json(msg))
        except StreamFailed as err:
            yield sse(ApiError(err.status, str(err), kind=err.kind).body())
        yield sse("[DONE]")
    finally:
        watcher.cancel()
        await messages.aclose()


def wire_json(msg: dict) -> dict:
    """A message as JSON; a result this server cannot send is one error line instead."""
    try:
        return to_json(msg)
    except TypeError as err:
        return ApiError(500, f"the result cannot be sent: {err}", kind="engine_error").body()
