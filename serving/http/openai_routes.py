"""The class kitchen's OpenAI routes: parse a request, admit it, hand it to the host.

The routes themselves are listed in serving/http/server.py; the answer's shape is
serving/http/answer.py; the queue bound serving/http/admission.py. A request is checked in this order, each refusal one line:
its body (413 over the size limit, 400 not JSON, 422 a malformed field), its model (404 another
one; no model at all means the one served here, as vLLM), the instructor's caps (400), the queue
bound (503 + Retry-After), then the engine's own limits (400, the engine's line).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from engine.chat import ChatTemplate
from engine.errors import EngineError
from serving.caps import Caps
from serving.host.handles import Handle, Refused
from serving.host.host import EngineHost
from serving.http.admission import Admission
from serving.http.answer import OrderAnswer
from serving.http.metrics import CONTENT_TYPE
from serving.http.openai_api import ApiError, CompletionRequest, parse_order, plain_template

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a 128k-token prompt as text or ids fits; a runaway upload does not
DEFAULT_CHAT_TOKENS = 256


@dataclass(frozen=True)
class ServerConfig:
    served_name: str  # what /v1/models lists; a request names it or no model at all
    api_key: str | None = None
    caps: Caps = field(default_factory=Caps)
    max_body_bytes: int = MAX_BODY_BYTES


class OpenAIRoutes:
    """A host's OpenAI routes and its status routes (/health, /metrics, /kitchen, the board): admission, streams."""

    def __init__(self, host: EngineHost, config: ServerConfig):
        self.host, self.config, self.metrics = host, config, host.metrics
        ready = host.process.ready
        self.template = (ChatTemplate(ready.chat_template, ready.bos_token, ready.eos_token).render
                         if ready.chat_template else plain_template)  # fmt: skip
        self.admission = Admission(lambda: host.in_flight, ready.serving.seats, config.caps.max_waiting,
                                   self.metrics.refused.inc)  # fmt: skip

    def served(self, model: str | None) -> str:
        """The served model's name for a request that names `model` (None: the one served here)."""
        if model is not None and model != self.config.served_name:
            raise ApiError(404, f"model '{model}' is not served here; GET /v1/models lists "
                                f"'{self.config.served_name}'", "model", "not_found_error")  # fmt: skip
        return self.config.served_name

    # -- routes -------------------------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        ready = self.host.process.ready
        return JSONResponse({"object": "list", "data": [{
            "id": self.config.served_name, "object": "model", "created": 0, "owned_by": "two-pot-kitchen",
            "max_model_len": ready.max_context,
        }]})  # fmt: skip

    async def health(self, request: Request) -> Response:
        ok = self.host.process.is_ready
        body = {"status": "ok" if ok else "starting", "model": self.config.served_name, "restarts": self.host.process.restarts}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def about(self, request: Request) -> Response:
        ready, caps = self.host.process.ready, self.config.caps
        return JSONResponse({
            "model": self.config.served_name, "device": ready.device, "dtype": ready.dtype, "policy": ready.policy,
            "seats": ready.serving.seats, "kv_tokens": ready.serving.kv_tokens, "max_context": ready.max_context,
            "batch_invariant": ready.batch_invariant,
            "caps": {"max_order_tokens": caps.max_order_tokens, "max_new_tokens": caps.max_new_tokens,
                     "max_order_seconds": caps.max_order_seconds, "max_waiting": caps.max_waiting},
            "caps_line": caps.summary(), "restarts": self.host.process.restarts,
            "queue": {"held": self.host.in_flight, "bound": self.admission.bound, "refused": self.admission.refused},
        })  # fmt: skip

    async def board(self, request: Request) -> Response:
        board = self.host.class_board
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
        order = dataclasses.replace(order, model=self.served(order.model))
        max_new = order.max_tokens or (DEFAULT_CHAT_TOKENS if chat else 16)
        if order.min_tokens > max_new:
            raise ApiError(422, f"field 'min_tokens' ({order.min_tokens}) must not exceed max_tokens ({max_new})",
                           "min_tokens")  # fmt: skip
        caps = self.config.caps
        try:
            caps.check([0], max_new)
        except EngineError as err:
            raise ApiError(400, str(err), "max_tokens") from None
        self.admission.admit(order.n)
        handles = await self._submit(order, max_new)
        try:
            caps.check([h.prompt_tokens for h in handles], max_new)
        except EngineError as err:
            self._cancel(handles)
            raise ApiError(400, str(err), "prompt") from None
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        if self.host.class_board is not None:
            self.host.class_board.order(rid, [h.key for h in handles])
        events = self._events(request, handles, time.monotonic() + caps.max_order_seconds)
        answer = OrderAnswer(order, rid, handles, self.host.cancel)
        if order.stream:
            return StreamingResponse(answer.stream(events), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})  # fmt: skip
        return await answer.whole(events)

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

    async def _submit(self, order: CompletionRequest, max_new: int) -> list[Handle]:
        handles = []
        seed = order.seed if order.seed is not None else secrets.randbelow(2**31)
        try:
            for i in range(order.n):
                handles.append(await self.host.submit(order.prompt, max_new, order.engine_settings(seed + i)))
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
                self.host.cancel(h.key)

    async def _events(self, request: Request, handles: list[Handle], deadline: float):
        """(choice index, kind, value) from every table, until each is done; cancels what is left if
        the client goes away or the order runs past its time (then yields (-1, "timeout", line)).

        Each table's events wait in their own queue, so a client that reads its stream slowly holds
        back only its own answer: the engine's step loop never waits for a reader."""
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
                if item[1] == "done" and item[2].metrics is not None:
                    self.admission.finished(item[2].metrics.e2e_s)
                yield item
        finally:
            for t in tasks:
                t.cancel()
            self._cancel(handles)
