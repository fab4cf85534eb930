"""The OpenAI-compatible request and response shapes the class kitchen speaks.

Parsing is strict where a mistake would silently change the order (a wrong type is a 422 naming
the field) and lenient where OpenAI clients send extras (unknown fields are ignored, as vLLM
does). Responses are OpenAI's shapes plus one extra field per chunk, `timings`, the kitchen's own
measurement of the step that produced it (as llama.cpp's server adds `timings`):

    {"phase": "decode", "step": 812, "step_ms": 3.1, "ttft_ms": 41.0, "kv_bytes": 1966080}

Chat prompts use the model's own chat template when its tokenizer has one (engine/chat.py renders
it, the one way the engine applies a template); otherwise the plain template below, a play script,
which is also what the chef was trained on:

    USER:
    Who is there?

    ASSISTANT:
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from engine.errors import EngineError
from serving.host.wire import StepInfo

MAX_N = 16  # tables per order: choices generated for one request
MAX_STOP = 4  # OpenAI's own limit on stop strings
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's chat limit; vLLM's default for both routes)


class ApiError(Exception):
    """An HTTP error with one clear line; `body()` is OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class CompletionRequest:
    """A parsed /v1/completions or /v1/chat/completions request."""

    chat: bool
    model: str | None  # None: the one model served here (as vLLM)
    prompt: str | list[int]
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    n: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # None: not asked; k: each token's logprob and its k likeliest rivals
    ignore_eos: bool = False  # vLLM's: EOS does not end the answer (benchmarks ask for exact lengths)
    min_tokens: int = 0  # vLLM's: EOS cannot end it before this many new tokens (stop strings neither)

    def engine_settings(self, seed: int) -> dict:
        """What the engine's submit() takes for one table of this order."""
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": seed, "stop_at_eos": not self.ignore_eos,
                "min_tokens": self.min_tokens, "logprobs": -1 if self.logprobs is None else self.logprobs}  # fmt: skip


def _field(body: dict, name: str, types, default=None, *, check=None, rule: str = ""):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ApiError(422, f"field '{name}' must be {rule}", name)
    if not isinstance(value, types) or (check is not None and not check(value)):
        raise ApiError(422, f"field '{name}' must be {rule} (got {json.dumps(value)[:60]})", name)
    return value


def parse_order(body, chat: bool, template) -> CompletionRequest:
    """`template(messages) -> str` renders chat messages (see `plain_template`)."""
    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object")
    model = _field(body, "model", str, rule="the name of a served model (GET /v1/models)")
    if chat:
        try:
            prompt = template(_messages(body.get("messages")))
        except EngineError as err:  # the model's own template refused the conversation (raise_exception)
            raise ApiError(422, str(err), "messages") from None
    else:
        prompt = _prompt(body.get("prompt"))
    max_tokens = _field(body, "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens",
                        int, check=lambda v: v >= 1, rule="an integer >= 1")  # fmt: skip
    stop = _field(body, "stop", (str, list), (), rule=f"a string or a list of at most {MAX_STOP} strings",
                  check=lambda v: isinstance(v, str) or (len(v) <= MAX_STOP and all(isinstance(s, str) and s for s in v)))  # fmt: skip
    options = _field(body, "stream_options", dict, {}, rule="an object like {\"include_usage\": true}")
    min_tokens = _field(body, "min_tokens", int, 0, check=lambda v: v >= 0, rule="an integer >= 0")
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(422, f"field 'min_tokens' ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens")
    return CompletionRequest(
        chat=chat, model=model, prompt=prompt, max_tokens=max_tokens,
        temperature=float(_field(body, "temperature", (int, float), 1.0, check=lambda v: 0 <= v <= 2, rule="between 0 and 2")),
        top_p=float(_field(body, "top_p", (int, float), 1.0, check=lambda v: 0 < v <= 1, rule="in (0, 1]")),
        seed=_field(body, "seed", int, rule="an integer"),
        n=_field(body, "n", int, 1, check=lambda v: 1 <= v <= MAX_N, rule=f"an integer from 1 to {MAX_N}"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stream=_field(body, "stream", bool, False, rule="true or false"),
        include_usage=bool(options.get("include_usage", False)),
        logprobs=_logprobs(body, chat), min_tokens=min_tokens,
        ignore_eos=_field(body, "ignore_eos", bool, False, rule="true or false"),
    )  # fmt: skip


def _logprobs(body: dict, chat: bool) -> int | None:
    """Chat: `logprobs: true` with `top_logprobs: k`; completions: `logprobs: k` (OpenAI's two shapes)."""
    rule = f"an integer from 0 to {MAX_TOP_LOGPROBS}"
    if chat:
        top = _field(body, "top_logprobs", int, check=lambda v: 0 <= v <= MAX_TOP_LOGPROBS, rule=rule)
        if not _field(body, "logprobs", bool, False, rule="true or false"):
            if top is not None:
                raise ApiError(422, "field 'top_logprobs' needs 'logprobs': true", "top_logprobs")
            return None
        return top or 0
    return _field(body, "logprobs", int, check=lambda v: 0 <= v <= MAX_TOP_LOGPROBS, rule=rule)


def _prompt(value) -> str | list[int]:
    rule = "text or a list of token ids"
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one prompt
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if value is None:
        raise ApiError(422, f"field 'prompt' is required: {rule}", "prompt")
    if isinstance(value, str):
        raise ApiError(422, "field 'prompt' is empty: give some text or token ids", "prompt")
    raise ApiError(422, f"field 'prompt' must be {rule} (one prompt per request; use n for tables)", "prompt")


def _messages(value) -> list[dict]:
    """Each message's content as text: a string, or OpenAI's list of parts `[{"type": "text", "text": ...}]`
    (joined); any other part (an image, audio) is refused, naming it: the chef reads text only."""
    rule = "a non-empty list of {\"role\": ..., \"content\": ...} with text content"
    if not isinstance(value, list) or not value:
        raise ApiError(422, f"field 'messages' must be {rule}", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(422, f"field 'messages' must be {rule} (message {i} is not)", "messages")
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(_text_part(i, part) for part in content)
        if not isinstance(content, str):
            raise ApiError(422, f"message {i}'s content must be text or a list of text parts", "messages")
        out.append(m | {"content": content})
    return out


def _text_part(i: int, part) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise ApiError(422, f"message {i} has a content part of type '{kind}'; this kitchen reads text parts only",
                   "messages")  # fmt: skip


def plain_template(messages: list[dict]) -> str:
    """Messages as a play script: `ROLE:\\ncontent\\n\\n` each, then `ASSISTANT:\\n` to answer."""
    return "".join(f"{m['role'].upper()}:\n{m['content']}\n\n" for m in messages) + "ASSISTANT:\n"


# -- responses -----------------------------------------------------------------------------------------


def timings(step: StepInfo | None, ttft_s: float | None) -> dict:
    out: dict = {"ttft_ms": None if ttft_s is None else round(ttft_s * 1e3, 3)}
    if step is not None:
        out |= {"phase": step.phase, "step": step.index, "step_ms": round(step.seconds * 1e3, 3),
                "kv_bytes": step.kv_bytes, "batch": step.batch}  # fmt: skip
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` counts the prompt's reused prefix."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}  # fmt: skip


def chunk(order: CompletionRequest, rid: str, index: int, text: str, finish: str | None, extra: dict, first: bool = False,
          logprobs: dict | None = None) -> dict:  # fmt: skip
    """One streamed piece of choice `index` (a chat choice's first piece also names the role)."""
    head = {"id": rid, "created": int(time.time()), "model": order.model}
    if order.chat:
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return head | {"object": "chat.completion.chunk", "choices": [choice]} | extra
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    return head | {"object": "text_completion", "choices": [choice]} | extra


def whole(order: CompletionRequest, rid: str, texts: list[str], finishes: list[str], use: dict, extra: dict,
          logprobs: list[dict | None] | None = None) -> dict:  # fmt: skip
    """The non-streamed response."""
    head = {"id": rid, "created": int(time.time()), "model": order.model, "usage": use}
    lps = logprobs or [None] * len(texts)
    rows = zip(texts, finishes, lps, strict=True)
    if order.chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": lp, "finish_reason": f}
                   for i, (t, f, lp) in enumerate(rows)]  # fmt: skip
        return head | {"object": "chat.completion", "choices": choices} | extra
    choices = [{"index": i, "text": t, "logprobs": lp, "finish_reason": f} for i, (t, f, lp) in enumerate(rows)]
    return head | {"object": "text_completion", "choices": choices} | extra


def logprobs_body(chat: bool, entries: list[tuple], offset: int = 0) -> dict:
    """OpenAI's logprobs object for these tokens, each (token text, logprob, ((rival text, logprob), ...))
    as the engine measured them. Completions: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`
    (from `offset`, the characters sent before); chat: `content`, one entry per token with its bytes."""
    if chat:
        def one(text: str, lp: float) -> dict:
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}

        return {"content": [one(t, lp) | {"top_logprobs": [one(rt, rlp) for rt, rlp in top]}
                            for t, lp, top in entries], "refusal": None}  # fmt: skip
    offsets = []
    for t, _, _ in entries:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": [t for t, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [dict(top) for _, _, top in entries], "text_offset": offsets}  # fmt: skip


def sse(obj) -> bytes:
    """One server-sent event: `data: {json}` and a blank line (or `data: [DONE]`)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
