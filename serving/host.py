"""The kitchen host as its clients see it: one interface, two ways to reach it.

A kitchen host is a class kitchen server's app (serving/server.py `create_app`): one engine in its
kitchen-loop process, the class board, the instructor's caps, the Lab's sweeps. The Kitchen page's
client (serving/kitchen_client.py `ServerKitchen`) speaks to it through `KitchenHost`:

- `LocalHost` (serving/kitchen_orders.py, beside the routes whose code it calls): the host lives in
  this very process (`two-pot-kitchen` mounts its kitchens inside the app's server,
  serving/mounted.py, and plain `streamlit run app.py` opens the same ones). The routes' own code
  is called directly, on an event loop of its own: no HTTP request from a process to itself, no
  JSON between two threads.
- `HttpHost` (here): the host is another process or machine (`--backend URL`, `two-pot-kitchen serve`).

Both give the same answers and the same message streams, and fail the same way:

    host.about()                      -> the served model (GET /kitchen/model); `NotReady` while it loads
    host.limits(100, 64)              -> a dict of engine.limits.Limits' fields
    host.check({"prompts": [...], "max_new_tokens": 64, ...})   -> token-id lists
    stream = host.order({"model": "chef", "prompts": [...], ...})
    for msg in stream: ...            # {"order": ID, "prompt_tokens": [...]}, then {"events": [...]}
    stream.close()                    # from any thread: the order is cancelled, the reader wakes
    host.lab("padding", settings)     # {"progress": record} ..., then {"result": result}
    host.board(order_id, since)       # the class board, or None

A refusal or an error message is `EngineError` with one line; a stream closed under its reader
raises `StreamClosed`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import httpx

from engine.errors import EngineError
from serving.lab_wire import decode, encode
from serving.remote_order import board as remote_board

NOT_TWO_POT = ("it has no /kitchen/model, so it is not a Two-Pot kitchen server and the Kitchen cannot draw "
               "its orders; the Class order page works with any OpenAI-compatible server")  # fmt: skip


class NotReady(EngineError):
    """The host is still loading its model (or cannot be reached yet): ask again shortly."""


class StreamClosed(RuntimeError):
    """The stream was closed (Cancel, a page gone) while its reader waited for the next message."""


class MessageStream(Protocol):
    def __iter__(self) -> Iterator[dict]: ...

    def close(self) -> None: ...


class KitchenHost(Protocol):
    label: str  # how error lines name it: "the kitchen server at http://..."

    def about(self) -> dict: ...

    def limits(self, prompt_tokens: int, max_new_tokens: int) -> dict: ...

    def check(self, body: dict) -> list[list[int]]: ...

    def order(self, body: dict) -> MessageStream: ...

    def lab(self, key: str, settings: Any, run: Callable | None = None) -> MessageStream: ...

    def board(self, order_id: str | None, since: int = -1) -> dict | None: ...

    def close(self) -> None: ...


def checked(msg: Any) -> dict:
    """A stream's message, or its error as `EngineError` (one line)."""
    if not isinstance(msg, dict):
        raise ValueError(f"an event must be a JSON object (got {json.dumps(msg)[:60]})")
    if "error" in msg:
        raise EngineError(msg["error"].get("message", "the kitchen server sent an error"))
    return msg


# -- over HTTP ---------------------------------------------------------------------------------------------------


class HttpHost:
    """A host at `url` (the address /kitchen/* and /v1/* hang under), with its API key if any."""

    def __init__(self, url: str, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.label = f"the kitchen server at {self.url}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One client for every request (keep-alive, one TLS setup): the board is read twice a second
        # while an order cooks, in the process whose cores the browser shares with the engine.
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(30.0, read=None))

    def about(self) -> dict:
        try:
            r = self._http.get(self.url + "/kitchen/model", timeout=10)
        except httpx.HTTPError as err:
            raise NotReady(f"{type(err).__name__}: {err}") from None
        if r.status_code == 200:
            return r.json()
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

    def limits(self, prompt_tokens: int, max_new_tokens: int) -> dict:
        return self._post("/kitchen/limits", {"prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens})

    def check(self, body: dict) -> list[list[int]]:
        return self._post("/kitchen/check", body)["prompt_ids"]

    def order(self, body: dict) -> HttpStream:
        return HttpStream(self._http, self.url + "/kitchen/orders", body)

    def lab(self, key: str, settings: Any, run: Callable | None = None) -> HttpStream:
        """Code does not travel: the server runs its registry's experiment `key` (`run` is not sent)."""
        unwire = lambda msg: {k: decode(v) for k, v in msg.items()}  # noqa: E731
        return HttpStream(self._http, f"{self.url}/kitchen/lab/{key}", {"settings": encode(settings)}, unwire)

    def board(self, order_id: str | None, since: int = -1) -> dict | None:
        return remote_board(self.url, order_id, since=since, client=self._http)

    def close(self) -> None:
        self._http.close()


class HttpStream:
    """One POST's server-sent messages; `close()` closes the response under its reader."""

    def __init__(self, http: httpx.Client, url: str, body: dict, unwire: Callable[[dict], dict] = lambda m: m):
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
