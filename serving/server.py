"""The class kitchen: one engine, one continuous batch, served over HTTP to a whole class.

    two-pot-kitchen serve --model chef --policy chunked --host 0.0.0.0 --port 8000 --api-key KEY

Every student's order joins the same running batch (serving/kitchen_loop.py steps it in its own
process), so the class itself is the dinner rush the lessons are about. The API is OpenAI's, so
the `openai` client, curl, vLLM's benchmark scripts and the app itself can all order:

    POST /v1/completions, /v1/chat/completions   streaming (SSE, `data: [DONE]`) or not
    GET  /v1/models                              the served model (clients never name a path)
    GET  /health                                 200 when the engine is ready, else 503
    GET  /metrics                                Prometheus text (serving/metrics.py)
    GET  /kitchen                                the policy, seats and the instructor's caps in force
    GET  /kitchen/board?order=ID&since=N         the whole class in the pot: tickets (yours marked when
                                                 you name your order's id), recent steps, the kitchen's
                                                 TTFT and TPOT (serving/class_board.py)
    POST /kitchen/orders (and /kitchen/model, /limits, /check)
                                                 the Kitchen page's order of B tables in the same batch,
                                                 every engine event streamed (serving/kitchen_orders.py)
    POST /kitchen/lab/{key}                      a Lab sweep in the server's own engine process, its
                                                 progress streamed (lab/on_server.py: an extension
                                                 the launcher and the app pass to `create_app`)

Errors are one line in OpenAI's error object: 400 a request the kitchen refuses (over the context,
the KV memory or an instructor's cap), 401 a wrong key, 404 an unknown model or path, 413 a body
over the size limit, 422 a malformed body (naming the field). A client that disconnects has its
sequences cancelled; an order past the instructor's time limit is cancelled and its stream ends
with an error event; if the engine process dies, streams in flight end with an error event
naming it and a new engine is started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.errors import EngineError
from serving.caps import Caps, load_caps
from serving.class_board import ClassBoard
from serving.engine_client import EngineClient, Handle, LoopSettings, Refused
from serving.kitchen_orders import KitchenOrders
from serving.metrics import CONTENT_TYPE, KitchenMetrics
from serving.openai_api import (
    ApiError,
    Order,
    chunk,
    jinja_template,
    parse_order,
    plain_template,
    sse,
    timings,
    usage,
    whole,
)  # fmt: skip

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a 128k-token prompt as text or ids fits; a runaway upload does not
DEFAULT_CHAT_TOKENS = 256


@dataclass(frozen=True)
class ServerConfig:
    served_name: str  # what /v1/models lists and clients must name
    api_key: str | None = None
    caps: Caps = field(default_factory=Caps)
    max_body_bytes: int = MAX_BODY_BYTES


class Choice:
    """One table's answer while it streams: the text so far, held back where a stop string may start."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.hold = stops, max((len(s) for s in stops), default=1) - 1
        self.text, self.sent, self.tokens, self.finish = "", 0, 0, None
        self.cached = 0  # prompt tokens the kitchen reused from a cached prefix
        self.ttft_s: float | None = None
        self.chunks = 0  # pieces sent so far

    def feed(self, piece: str, engine_finish: str | None) -> str:
        """Add the engine's next piece; return what may be sent now. Sets `finish` when it ends."""
        self.tokens += 1
        self.text += piece
        hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.text, self.finish = self.text[: min(hits)], "stop"
        elif engine_finish is not None:
            self.finish = engine_finish
        end = len(self.text) if self.finish else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : end], end
        return out


class Kitchen:
    """The HTTP side: parses orders, hands them to the engine client, streams the answers."""

    def __init__(self, client: EngineClient, config: ServerConfig, metrics: KitchenMetrics):
        self.client, self.config, self.metrics = client, config, metrics
        ready = client.ready
        self.template = (jinja_template(ready.chat_template, ready.bos_token, ready.eos_token)
                         if ready.chat_template else plain_template)  # fmt: skip

    # -- routes -------------------------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        ready = self.client.ready
        return JSONResponse({"object": "list", "data": [{
            "id": self.config.served_name, "object": "model", "created": 0, "owned_by": "two-pot-kitchen",
            "max_model_len": ready.max_context,
        }]})  # fmt: skip

    async def health(self, request: Request) -> Response:
        ok = self.client.is_ready
        body = {"status": "ok" if ok else "starting", "model": self.config.served_name, "restarts": self.client.restarts}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def about(self, request: Request) -> Response:
        ready, caps = self.client.ready, self.config.caps
        return JSONResponse({
            "model": self.config.served_name, "device": ready.device, "dtype": ready.dtype, "policy": ready.policy,
            "seats": ready.seats, "kv_tokens": ready.kv_tokens, "max_context": ready.max_context,
            "caps": {"max_order_tokens": caps.max_order_tokens, "max_new_tokens": caps.max_new_tokens,
                     "max_order_seconds": caps.max_order_seconds},
            "caps_line": caps.summary(), "restarts": self.client.restarts,
        })  # fmt: skip

    async def board(self, request: Request) -> Response:
        board = self.client.board
        if board is None:
            raise ApiError(404, "this kitchen keeps no class board", kind="not_found_error")
        since = request.query_params.get("since", "-1")
        if not since.lstrip("-").isdigit():
            raise ApiError(400, f"since must be a step number (got '{since[:40]}')", "since")
        return JSONResponse(board.snapshot(request.query_params.get("order") or None, int(since)))

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def completions(self, request: Request) -> Response:
        return await self._order(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._order(request, chat=True)

    # -- one order ---------------------------------------------------------------------------------------------
    async def _order(self, request: Request, chat: bool) -> Response:
        order = parse_order(await self._json(request), chat, self.template)
        if order.model != self.config.served_name:
            raise ApiError(404, f"model '{order.model}' is not served here; GET /v1/models lists "
                                f"'{self.config.served_name}'", "model", "not_found_error")  # fmt: skip
        max_new = order.max_tokens or (DEFAULT_CHAT_TOKENS if chat else 16)
        caps = self.config.caps
        try:
            caps.check([0], max_new)
        except EngineError as err:
            raise ApiError(400, str(err), "max_tokens") from None
        handles = await self._submit(order, max_new)
        try:
            caps.check([h.prompt_tokens for h in handles], max_new)
        except EngineError as err:
            self._cancel(handles)
            raise ApiError(400, str(err), "prompt") from None
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        if self.client.board is not None:
            self.client.board.order(rid, [h.key for h in handles])
        events = self._events(request, handles, time.monotonic() + caps.max_order_seconds)
        if order.stream:
            return StreamingResponse(self._stream(order, rid, handles, events), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})  # fmt: skip
        return await self._whole(order, rid, handles, events)

    async def _json(self, request: Request):
        declared = request.headers.get("content-length")
        limit = self.config.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the body is {int(declared):,} bytes; the limit is {limit:,} bytes")
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise ApiError(413, f"the body is over the limit of {limit:,} bytes")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ApiError(400, f"the body is not valid JSON: {err}") from None

    async def _submit(self, order: Order, max_new: int) -> list[Handle]:
        handles = []
        seed = order.seed if order.seed is not None else secrets.randbelow(2**31)
        try:
            for i in range(order.n):
                settings = {"temperature": order.temperature, "top_p": order.top_p, "seed": seed + i}
                handles.append(await self.client.submit(order.prompt, max_new, settings))
        except Refused as err:
            self._cancel(handles)
            raise ApiError(400, str(err), "prompt") from None
        except EngineError as err:
            self._cancel(handles)
            raise ApiError(503, str(err), kind="server_error") from None
        return handles

    def _cancel(self, handles: list[Handle]) -> None:
        for h in handles:
            if not h.finished:
                self.client.cancel(h.key)

    async def _events(self, request: Request, handles: list[Handle], deadline: float):
        """(choice index, kind, value) from every table, until each is done; cancels what is left if
        the client goes away or the order runs past its time (then yields (-1, "timeout", line))."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, handle: Handle) -> None:
            async for kind, value in handle:
                await queue.put((i, kind, value))

        async def watch() -> None:  # the client hanging up shows as http.disconnect on receive()
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self._cancel(handles)

        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)] + [asyncio.create_task(watch())]
        left = len(handles)
        try:
            while left:
                try:
                    item = await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    self._cancel(handles)
                    yield -1, "timeout", self.config.caps.time_line()
                    return
                left -= item[1] in ("done", "error")
                yield item
        finally:
            for t in tasks:
                t.cancel()
            self._cancel(handles)

    async def _stream(self, order: Order, rid: str, handles: list[Handle], events):
        choices = [Choice(order.stop) for _ in handles]
        async for i, kind, value in events:
            if kind == "token":
                c = choices[i]
                if c.finish:
                    continue  # past a stop string: the rest is cancelled and not sent
                if value.ttft_s is not None:
                    c.ttft_s = value.ttft_s
                text = c.feed(value.text, None)
                if c.finish:
                    self.client.cancel(handles[i].key)
                if text or c.finish:
                    c.chunks += 1
                    yield sse(chunk(order, rid, i, text, c.finish, {"timings": timings(value.step, c.ttft_s)},
                                    first=c.chunks == 1))  # fmt: skip
            elif kind == "done":
                c = choices[i]
                c.cached = value.metrics.cached_tokens if value.metrics is not None else 0
                if not c.finish:
                    reason = "length" if value.finish_reason == "length" else "stop"
                    rest = c.feed("", reason)
                    c.tokens -= 1  # feed("") is no token
                    c.chunks += 1
                    yield sse(chunk(order, rid, i, rest, reason, {"timings": timings(None, c.ttft_s)},
                                    first=c.chunks == 1))  # fmt: skip
            else:  # "error" (the engine process died) or "timeout" (the instructor's limit)
                kind_name = "engine_error" if kind == "error" else "timeout_error"
                yield sse({"error": {"message": value, "type": kind_name, "param": None, "code": 500 if kind == "error" else 408}})
                break
        if order.include_usage:
            use = usage(handles[0].prompt_tokens, sum(c.tokens for c in choices), choices[0].cached)
            yield sse({"id": rid, "object": "chat.completion.chunk" if order.chat else "text_completion",
                       "created": int(time.time()), "model": order.model, "choices": [], "usage": use})  # fmt: skip
        yield sse("[DONE]")

    async def _whole(self, order: Order, rid: str, handles: list[Handle], events) -> Response:
        choices = [Choice(order.stop) for _ in handles]
        metrics = [None] * len(handles)
        async for i, kind, value in events:
            if kind == "token" and not choices[i].finish:
                choices[i].feed(value.text, None)
                if choices[i].finish:
                    self.client.cancel(handles[i].key)
            elif kind == "done":
                metrics[i] = value.metrics
                choices[i].cached = value.metrics.cached_tokens if value.metrics is not None else 0
                if not choices[i].finish:
                    choices[i].feed("", "length" if value.finish_reason == "length" else "stop")
                    choices[i].tokens -= 1
            elif kind in ("error", "timeout"):
                status = 500 if kind == "error" else 408
                raise ApiError(status, value, kind="engine_error" if kind == "error" else "timeout_error")
        per_choice = [None if m is None else {
            "queue_ms": m.queue_s * 1e3, "ttft_ms": m.ttft_s * 1e3, "e2e_ms": m.e2e_s * 1e3,
            "tpot_ms": None if m.tpot_s is None else m.tpot_s * 1e3,
        } for m in metrics]  # fmt: skip
        use = usage(handles[0].prompt_tokens, sum(c.tokens for c in choices), choices[0].cached)
        body = whole(order, rid, [c.text for c in choices], [c.finish for c in choices], use,
                     {"timings": {"choices": per_choice}})  # fmt: skip
        return JSONResponse(body)


def create_app(client: EngineClient, config: ServerConfig, metrics: KitchenMetrics,
               extensions: Sequence[Callable] = ()) -> Starlette:  # fmt: skip
    """The server's app. `extensions`: factories `f(kitchen)` of objects with `routes()` and `close()`
    (the Lab's, lab/on_server.py); `close_app(app)` closes them when the server stops."""
    kitchen = Kitchen(client, config, metrics)
    extras = [make(kitchen) for make in extensions]

    async def api_error(request: Request, err: ApiError) -> Response:
        return JSONResponse(err.body(), status_code=err.status)

    async def unexpected(request: Request, err: Exception) -> Response:  # a bug: still one line, no traceback
        line = " ".join(f"{type(err).__name__}: {err}".split())
        return JSONResponse(ApiError(500, line, kind="server_error").body(), status_code=500)

    routes = [
        Route("/v1/completions", kitchen.completions, methods=["POST"]),
        Route("/v1/chat/completions", kitchen.chat, methods=["POST"]),
        Route("/v1/models", kitchen.models, methods=["GET"]),
        Route("/health", kitchen.health, methods=["GET"]),
        Route("/metrics", kitchen.prometheus, methods=["GET"]),
        Route("/kitchen", kitchen.about, methods=["GET"]),
        Route("/kitchen/board", kitchen.board, methods=["GET"]),
        *KitchenOrders(kitchen).routes(),
        *[route for extra in extras for route in extra.routes()],
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, Exception: unexpected})
    app.state.extensions = extras
    app.state.kitchen = kitchen  # for a client in this process (serving/host.py `LocalHost`)
    app.add_middleware(_KeyCheck, key=config.api_key)
    return app


def close_app(app: Starlette) -> None:
    """Stop what the app's extensions started (the Lab's engine process, if a sweep started one)."""
    for extra in app.state.extensions:
        extra.close()


class _KeyCheck:
    """`Authorization: Bearer KEY` on /v1/* and /kitchen/* (the board, the Kitchen's orders) when the server
    has a key (401 otherwise)."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")[len(scope.get("root_path", "")) :]  # inside a mount (serving/mounted.py)
        if self.key and scope["type"] == "http" and path.startswith(("/v1/", "/kitchen/")):
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"").decode(errors="replace")
            if not secrets.compare_digest(given, f"Bearer {self.key}"):
                err = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", kind="authentication_error")
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- the command ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from engine.cli import OneLineParser

    p = OneLineParser(prog="two-pot-kitchen serve", description="one kitchen server for a whole class")
    p.add_argument("--model", default="chef", help="a catalog name, preset:NAME or a local model folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | int8 (int8 weight matrices)")
    p.add_argument("--policy", default="chunked", help="static | continuous | chunked")
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--max-seqs", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-prefix-cache", action="store_true", help="recompute shared prompt prefixes every time")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--config", default=None, help="the instructor's caps (TOML with a [caps] table)")
    return p


def served_name(model: str) -> tuple[str, str]:
    """(what clients call it, what Engine.load gets): a catalog name keeps its name; a folder is
    served under its own name, so no path ever appears in the API."""
    from serving.catalog import resolve_source

    source = resolve_source(model)
    if source is not None:  # an embedded model keeps its name, so the engine's info says "chef", not a folder
        embedded = Path(__file__).resolve().parent.parent / "assets" / "models" / model
        return model, model if Path(source).resolve() == embedded.resolve() else source
    return (Path(model).name if Path(model).is_dir() else model), model


def main(argv: list[str] | None = None, extensions: Sequence[Callable] = ()) -> int:
    import uvicorn

    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        caps = load_caps(args.config)
        name, source = served_name(args.model)
        metrics = KitchenMetrics(name)
        print(f"loading {name} on {args.device} ({args.dtype}, policy {args.policy})...", file=sys.stderr)
        client = EngineClient(LoopSettings(source, args.device, args.dtype, args.policy, args.token_budget,
                                           args.max_seqs, args.threads, not args.no_prefix_cache), metrics,
                              ClassBoard())  # fmt: skip
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    app = create_app(client, ServerConfig(name, args.api_key, caps), metrics, extensions)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"the class kitchen is open at http://{_address(args.host)}:{args.port}/v1 (model '{name}')", file=sys.stderr)
        if not args.api_key:
            print("warning: no --api-key: anyone who can reach this address can order", file=sys.stderr)
    else:
        print(f"the kitchen is open at http://{args.host}:{args.port}/v1 (model '{name}')", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        close_app(app)
        client.close()
    return 0


def _address(host: str) -> str:
    """The address to share with the class: this machine's outward-facing IP for 0.0.0.0."""
    if host not in ("0.0.0.0", "::"):
        return host
    import socket

    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return host


if __name__ == "__main__":
    sys.exit(main())
