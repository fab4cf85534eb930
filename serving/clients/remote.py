"""A host in another process or machine, over HTTP: `RemoteHost`, the `Host` of serving/host/api.py.

`two-pot-kitchen --backend http://GPU-BOX:8000` cooks the Kitchen's orders and runs the Lab's
sweeps on a `two-pot-kitchen serve` across the room; its routes (serving/http/order_routes.py) are
the host's own calls, so this client gives the same answers and message streams as the host in
process, and fails the same way: a refusal is `EngineError` in one line, a stream closed under
its reader raises `StreamClosed`.

    host = RemoteHost("http://GPU-BOX:8000", api_key="SECRET")
    order = host.check(OrderForm(["ROMEO:"], 32))      # POST /kitchen/check
    for msg in host.order(order): ...                  # POST /kitchen/orders, server-sent events
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from engine.errors import EngineError
from engine.limits import Limits
from serving.clients.remote_order import board as remote_board
from serving.host.api import CheckedOrder, NotReady, OrderForm, StreamClosed, StreamFailed
from serving.host.wire import from_json, to_json

NOT_TWO_POT = ("it has no /kitchen/model, so it is not a Two-Pot kitchen server and the Kitchen cannot draw "
               "its orders; the Class order page works with any OpenAI-compatible server")  # fmt: skip


def checked(msg: Any) -> dict:
    """A stream's message, or its error as `StreamFailed` (one line, with the server's status and type)."""
    if not isinstance(msg, dict):
        raise ValueError(f"an event must be a JSON object (got {json.dumps(msg)[:60]})")
    if "error" in msg:
        err = msg["error"]
        raise StreamFailed(err.get("message", "the kitchen server sent an error"), err.get("code") or 500,
                           err.get("type") or "engine_error")  # fmt: skip
    return msg


class RemoteHost:
    """A host at `url` (the address /kitchen/* and /v1/* hang under), with its API key if any."""

    def __init__(self, url: str, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.label = f"the kitchen server at {self.url}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One client for every request (keep-alive, one TLS setup): the board is read twice a second
        # while an order cooks, in the process whose cores the browser shares with the engine.
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(30.0, read=None))
        self.name: str | None = None  # the served model, once `about()` has answered

    def about(self) -> dict:
        try:
            r = self._http.get(self.url + "/kitchen/model", timeout=10)
        except httpx.HTTPError as err:
            raise NotReady(f"{type(err).__name__}: {err}") from None
        if r.status_code == 200:
            about = r.json()
            self.name = about.get("name")
            return about
        if r.status_code == 503:
            raise NotReady(error_line(r))
        if r.status_code == 404 and "/kitchens/" not in self.url:
            raise EngineError(NOT_TWO_POT)
        raise EngineError(error_line(r))

    def _post(self, path: str, body: dict) -> Any:
        try:
            r = self._http.post(self.url + path, json=body, timeout=30)
        except httpx.HTTPError as err:
            raise EngineError(f"{self.label} did not answer: {type(err).__name__}: {err}") from None
        if r.status_code != 200:
            raise EngineError(error_line(r))
        return r.json()

    def limits(self, prompt_tokens: int, max_new_tokens: int) -> Limits:
        return Limits(**self._post("/kitchen/limits", {"prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens}))

    def check(self, form: OrderForm) -> CheckedOrder:
        ids = self._post("/kitchen/check", form_body(form))["prompt_ids"]
        return CheckedOrder(ids, form.max_new_tokens, dict(form.settings))

    def order(self, order: CheckedOrder) -> HttpStream:
        """The server checks the order once more (its own caps and limits): nothing a client sends is taken on trust."""
        body = {"model": self.name or self.about().get("name"), "prompts": order.prompt_ids,
                "max_new_tokens": order.max_new_tokens, **order.settings}  # fmt: skip
        return HttpStream(self._http, self.url + "/kitchen/orders", body)

    def lab(self, key: str, settings: Any) -> HttpStream:
        """Code does not travel: the server runs its registry's experiment `key` with these settings."""
        return HttpStream(self._http, f"{self.url}/kitchen/lab/{key}", {"settings": to_json(settings)})

    def board(self, order_id: str | None, since: int = -1) -> dict | None:
        return remote_board(self.url, order_id, since=since, client=self._http)

    def close(self) -> None:
        self._http.close()


def form_body(form: OrderForm) -> dict:
    """An `OrderForm` as the routes' JSON: generated prompts as their filler, tables and length."""
    body = {"max_new_tokens": form.max_new_tokens, **form.settings}
    if form.filler is not None:
        return body | {"filler": form.filler, "tables": form.tables, "prompt_tokens": form.prompt_tokens}
    return body | {"prompts": form.prompts}


class HttpStream:
    """One POST's server-sent messages (serving/host/wire.py's JSON, rebuilt); `close()` closes the
    response under its reader."""

    def __init__(self, http: httpx.Client, url: str, body: dict, unwire: Callable[[Any], Any] = from_json):
        self._http, self._url, self._body, self._unwire = http, url, body, unwire
        self._response: httpx.Response | None = None
        self._closed = False

    def __iter__(self) -> Iterator[dict]:
        with self._http.stream("POST", self._url, json=self._body) as r:
            self._response = r
            if self._closed:
                raise StreamClosed("the order's stream was closed")
            if r.status_code != 200:
                raise EngineError(error_line(r, r.read()))
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield self._unwire(checked(json.loads(line[6:])))

    def close(self) -> None:
        self._closed = True
        if self._response is not None:
            self._response.close()  # the reading thread wakes with an error; the server cancels at its next step


def error_line(r: httpx.Response, raw: bytes | None = None) -> str:
    """The server's one-line error (OpenAI's error object), or the status and the start of the body."""
    raw = r.content if raw is None else raw
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:200].decode(errors="replace")
    return " ".join(f"HTTP {r.status_code}: {message}".split())
