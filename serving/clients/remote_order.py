"""One order to any OpenAI-compatible server, measured from the stream at the client.

What a browser page can know about a kitchen it does not own: when it sent the order, when each
chunk of text arrived, and the usage the server reports. From those: TTFT, the gaps between
chunks (ITL as the client sees it, network and batching included), TPOT and tokens/s. A Two-Pot
class server also sends its own `timings` on each chunk (the phase and time of the step that made
it, its batch size, KV bytes); vLLM and llama.cpp send none or their own, and the page says so.

    out = order_remote("http://127.0.0.1:8000", "chef", "ROMEO:", 32)
    out.ttft_s, out.tpot_s, out.text, out.server_steps  # server_steps: [] unless ours
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from engine.errors import EngineError


@dataclass
class RemoteOrder:
    text: str = ""
    sent: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # seconds after sending, one per text chunk
    done_s: float | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    server_steps: list[dict] = field(default_factory=list)  # our server's `timings`, one per chunk
    server_ttft_s: float | None = None
    order_id: str | None = None  # the stream's `id`: names this order on a Two-Pot class board
    token_logprobs: list[tuple[str, float]] = field(default_factory=list)  # (token, logprob), when asked and sent

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        n = len(self.chunk_times)
        return (self.chunk_times[-1] - self.chunk_times[0]) / (n - 1) if n > 1 else None

    @property
    def tokens_per_s(self) -> float | None:
        if not self.completion_tokens or not self.done_s:
            return None
        return self.completion_tokens / self.done_s


def models(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """The model ids a server offers (GET /v1/models), or EngineError with one line."""
    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", headers=_auth(api_key), timeout=timeout_s)
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError) as err:
        raise EngineError(f"could not list the models at {url}/v1/models: {type(err).__name__}: {err}") from None


def order_remote(url: str, model: str, prompt: str, max_tokens: int, temperature: float = 0.0,
                 api_key: str | None = None, timeout_s: float = 300.0, on_chunk=None,
                 logprobs: int | None = None) -> RemoteOrder:  # fmt: skip
    """Stream one completion; `on_chunk(RemoteOrder)` after each text chunk (for a live page).
    `logprobs`: ask for each token's log-probability (OpenAI's completions field; the server's own
    numbers land in `token_logprobs`, none from a server that ignores it).
    A refusal or a dropped stream raises EngineError with the server's one line."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}} | ({"logprobs": logprobs} if logprobs is not None else {})  # fmt: skip
    out = RemoteOrder()
    out.sent = time.perf_counter()
    try:
        with httpx.stream("POST", url.rstrip("/") + "/v1/completions", json=body, headers=_auth(api_key),
                          timeout=timeout_s) as r:  # fmt: skip
            if r.status_code != 200:
                raise EngineError(_error_line(r.read(), r.status_code))
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunks = len(out.chunk_times)
                _take(out, json.loads(line[6:]), time.perf_counter() - out.sent)
                if on_chunk is not None and len(out.chunk_times) > chunks:
                    on_chunk(out)
    except httpx.HTTPError as err:
        raise EngineError(f"the order to {url} failed: {type(err).__name__}: {err}") from None
    out.done_s = time.perf_counter() - out.sent
    return out


def board(url: str, order_id: str | None = None, since: int = -1, api_key: str | None = None,
          timeout_s: float = 2.0, client: httpx.Client | None = None) -> dict | None:  # fmt: skip
    """A Two-Pot class kitchen's board (serving/http/board.py), your order's tickets marked; None from a
    server that keeps none (vLLM, llama.cpp) or does not answer in time: the page then shows no rail.
    `client`: a caller's own (kept-alive) client, with its key in its headers."""
    params = {"since": since} | ({"order": order_id} if order_id else {})
    try:
        get = client.get if client is not None else httpx.get
        r = get(url.rstrip("/") + "/kitchen/board", params=params, headers=_auth(api_key), timeout=timeout_s)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _take(out: RemoteOrder, ev: dict, t: float) -> None:
    if "error" in ev:
        raise EngineError(ev["error"].get("message", "the server sent an error"))
    out.order_id = ev.get("id") or out.order_id
    for c in ev.get("choices", []):
        if c.get("text"):
            out.text += c["text"]
            out.chunk_times.append(t)
        out.finish_reason = c.get("finish_reason") or out.finish_reason
        lp = c.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("tokens"), list):  # OpenAI's completions shape
            out.token_logprobs += [(t, v) for t, v in zip(lp["tokens"], lp.get("token_logprobs") or [], strict=False)
                                   if isinstance(v, int | float)]  # fmt: skip
        elif isinstance(lp, dict) and isinstance(lp.get("content"), list):  # the chat shape (llama.cpp sends it here too)
            out.token_logprobs += [(e["token"], e["logprob"]) for e in lp["content"]
                                   if isinstance(e, dict) and isinstance(e.get("logprob"), int | float)]  # fmt: skip
    if ev.get("usage"):
        out.prompt_tokens = ev["usage"].get("prompt_tokens")
        out.completion_tokens = ev["usage"].get("completion_tokens")
    timings = ev.get("timings")
    if isinstance(timings, dict) and "phase" in timings:  # a Two-Pot kitchen server's own measurement
        out.server_steps.append(timings)
        out.server_ttft_s = (timings.get("ttft_ms") or 0) / 1e3 or out.server_ttft_s


def _auth(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _error_line(raw: bytes, status: int) -> str:
    try:
        err = json.loads(raw)
        message = err.get("error", {}).get("message") if isinstance(err.get("error"), dict) else err.get("detail")
    except ValueError:
        message = None
    return " ".join(f"HTTP {status}: {message or raw[:200].decode(errors='replace')}".split())
