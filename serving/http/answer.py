"""One order's answer, from the engine's events to OpenAI's response: streamed chunks or one body.

The events come from the kitchen (serving/http/openai_routes.py `OpenAIRoutes._events`): (choice index,
kind, value) for every table of the order, kind "token" (handles.Tok), "done"
(RequestOutput), "error" (the engine process died) or "timeout" (the instructor's limit). Stop
strings are the server's: the engine streams tokens, a `Choice` holds back the text where a stop
string may start and cuts the answer where one is found (only once the request has its
`min_tokens`, as vLLM), and the rest of that table is cancelled. Logprobs are the engine's own,
sent with the chunk whose text their tokens made.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.responses import JSONResponse

from serving.host.handles import Handle
from serving.http.openai_api import (
    ApiError,
    CompletionRequest,
    chunk,
    logprobs_body,
    sse,
    timings,
    usage,
    whole,
)


class Choice:
    """One table's answer while it streams: the text so far, held back where a stop string may start."""

    def __init__(self, stops: tuple[str, ...], min_tokens: int = 0):
        self.stops, self.hold = stops, max((len(s) for s in stops), default=1) - 1
        self.min_tokens, self.gate = min_tokens, 0  # stop strings are looked for from `gate` on
        self.text, self.sent, self.tokens, self.finish = "", 0, 0, None
        self.cached = 0  # prompt tokens the kitchen reused from a cached prefix
        self.ttft_s: float | None = None
        self.chunks = 0  # pieces sent so far
        self.logprobs: list[tuple] = []  # (token text, logprob, rivals) of every token kept
        self.unsent_logprobs = 0  # of those, how many the next chunk carries

    def feed(self, piece: str, engine_finish: str | None, logprobs: tuple | None = None) -> str:
        """Add the engine's next token's text; return what may be sent now. Sets `finish` when it ends."""
        self.tokens += 1
        if logprobs is not None:
            self.logprobs.append(logprobs)
            self.unsent_logprobs += 1
        return self._add(piece, engine_finish)

    def end(self, engine_finish: str) -> str:
        """The engine finished this table: whatever was held back goes now."""
        return self._add("", engine_finish)

    def _add(self, piece: str, engine_finish: str | None) -> str:
        self.text += piece
        if self.tokens < self.min_tokens:
            self.gate = len(self.text)
        hits = [i for i in (self.text.find(s, max(0, self.gate - len(s) + 1)) for s in self.stops) if i >= 0] \
            if self.tokens >= self.min_tokens else []  # fmt: skip
        if hits:
            self.text, self.finish = self.text[: min(hits)], "stop"
        elif engine_finish is not None:
            self.finish = engine_finish
        end = len(self.text) if self.finish else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : end], end
        return out

    def take_logprobs(self, chat: bool, offset: int) -> dict | None:
        """The logprobs the next chunk carries (None when the order asked for none)."""
        if not self.logprobs:
            return None
        entries = self.logprobs[len(self.logprobs) - self.unsent_logprobs :]
        self.unsent_logprobs = 0
        return logprobs_body(chat, entries, offset)


def _reason(engine_reason: str) -> str:
    return "length" if engine_reason == "length" else "stop"


class OrderAnswer:
    """The response to one order of `handles` (one per table); `cancel(key)` stops a table early."""

    def __init__(self, order: CompletionRequest, rid: str, handles: list[Handle], cancel: Callable[[str], None]):
        self.order, self.rid, self.handles, self.cancel = order, rid, handles, cancel
        self.choices = [Choice(order.stop, order.min_tokens) for _ in handles]

    def _usage(self) -> dict:
        return usage(self.handles[0].prompt_tokens, sum(c.tokens for c in self.choices), self.choices[0].cached)

    async def stream(self, events):
        order = self.order
        async for i, kind, value in events:
            c = self.choices[i] if i >= 0 else None
            if kind == "token":
                if c.finish:
                    continue  # past a stop string: the rest is cancelled and not sent
                if value.ttft_s is not None:
                    c.ttft_s = value.ttft_s
                before = c.sent
                text = c.feed(value.text, None, value.logprobs)
                if c.finish:
                    self.cancel(self.handles[i].key)
                if text or c.finish:
                    yield self._chunk(i, c, text, before, timings(value.step, c.ttft_s))
            elif kind == "done":
                c.cached = value.metrics.cached_tokens if value.metrics is not None else 0
                if not c.finish:
                    before = c.sent
                    rest = c.end(_reason(value.finish_reason))
                    yield self._chunk(i, c, rest, before, timings(None, c.ttft_s))
            else:  # "error" (the engine process died) or "timeout" (the instructor's limit)
                kind_name = "engine_error" if kind == "error" else "timeout_error"
                yield sse({"error": {"message": value, "type": kind_name, "param": None,
                                     "code": 500 if kind == "error" else 408}})  # fmt: skip
                break
        if order.include_usage:
            yield sse({"id": self.rid, "object": "chat.completion.chunk" if order.chat else "text_completion",
                       "created": int(time.time()), "model": order.model, "choices": [], "usage": self._usage()})  # fmt: skip
        yield sse("[DONE]")

    def _chunk(self, i: int, c: Choice, text: str, offset: int, times: dict) -> bytes:
        c.chunks += 1
        return sse(chunk(self.order, self.rid, i, text, c.finish, {"timings": times}, first=c.chunks == 1,
                         logprobs=c.take_logprobs(self.order.chat, offset)))  # fmt: skip

    async def whole(self, events) -> JSONResponse:
        metrics = [None] * len(self.handles)
        for_choice = self.choices
        async for i, kind, value in events:
            if kind == "token" and not for_choice[i].finish:
                for_choice[i].feed(value.text, None, value.logprobs)
                if for_choice[i].finish:
                    self.cancel(self.handles[i].key)
            elif kind == "done":
                metrics[i] = value.metrics
                for_choice[i].cached = value.metrics.cached_tokens if value.metrics is not None else 0
                if not for_choice[i].finish:
                    for_choice[i].end(_reason(value.finish_reason))
            elif kind in ("error", "timeout"):
                status = 500 if kind == "error" else 408
                raise ApiError(status, value, kind="engine_error" if kind == "error" else "timeout_error")
        per_choice = [None if m is None else {
            "queue_ms": m.queue_s * 1e3, "ttft_ms": m.ttft_s * 1e3, "e2e_ms": m.e2e_s * 1e3,
            "tpot_ms": None if m.tpot_s is None else m.tpot_s * 1e3,
        } for m in metrics]  # fmt: skip
        logprobs = [logprobs_body(self.order.chat, c.logprobs) if self.order.logprobs is not None else None
                    for c in for_choice]  # fmt: skip
        body = whole(self.order, self.rid, [c.text for c in for_choice], [c.finish for c in for_choice],
                     self._usage(), {"timings": {"choices": per_choice}}, logprobs)  # fmt: skip
        return JSONResponse(body)
