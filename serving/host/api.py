"""The host as its clients see it: one interface, whether the host is in this process or across the room.

A host owns one engine in its own process (serving/host/process.py) and serves every client of
it: the Kitchen's orders, the Lab's sweeps, the class's requests. Two implementations:

  EngineHost   (serving/host/host.py) the host itself, in this process: the app's own kitchens
               and `two-pot-kitchen serve` (whose HTTP routes are an adapter over it)
  RemoteHost   (serving/clients/remote.py) a host in another process or machine, over those routes

    host.about()                           -> the served model; `NotReady` while it loads
    host.limits(100, 64)                   -> engine.limits.Limits: what one order may ask
    order = host.check(OrderForm(["ROMEO:"] * 4, 64))   -> CheckedOrder: its token ids, the caps met
    stream = host.order(order)             # the checked order joins the batch
    for msg in stream: ...                 # {"order": ID, "prompt_tokens": [...]}, then {"events": [...]}
    stream.close()                         # from any thread: the order is cancelled, the reader wakes
    host.lab("padding", settings)          # {"progress": record} ..., then {"result": result}
    host.board(order_id, since)            # the class board, or None

Checking is the one question an order asks the engine before it cooks, and its answer is the
order's token ids, which the order then carries: a generated prompt is cut from its filler text
by the engine's own tokenizer (`generated_prompts`), once. A refusal is `EngineError` in one line;
a stream closed under its reader raises `StreamClosed`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.errors import EngineError
from engine.limits import Limits

ORDER_KEYS = ("temperature", "seed", "reuse_prefix")  # what an order may set besides its prompts and length
GENERATED_STRIDE = 7  # table i's generated prompt starts i x 7 tokens into the filler


class NotReady(EngineError):
    """The host is still loading its model (or cannot be reached yet): ask again shortly."""


class StreamClosed(RuntimeError):
    """The stream was closed (Cancel, a page gone) while its reader waited for the next message."""


class StreamFailed(EngineError):
    """An order or a sweep that failed after it started (the engine process died, the instructor's
    time cap): one line, with the HTTP status and error type a server reports it under."""

    def __init__(self, line: str, status: int = 500, kind: str = "engine_error"):
        super().__init__(line)
        self.status, self.kind = status, kind


@dataclass(frozen=True)
class OrderForm:
    """An order as a client asks for it: `prompts` (text or token ids, one per table), or `tables`
    prompts of `prompt_tokens` ids each cut from the `filler` text (`generated_prompts`)."""

    prompts: list = field(default_factory=list)
    max_new_tokens: int = 16
    settings: dict = field(default_factory=dict)  # temperature, seed, reuse_prefix (ORDER_KEYS)
    filler: str | None = None
    tables: int = 0
    prompt_tokens: int = 0


@dataclass(frozen=True)
class CheckedOrder:
    """An order the host has checked (the engine's limits, the instructor's caps): what it cooks."""

    prompt_ids: list[list[int]]
    max_new_tokens: int
    settings: dict

    @property
    def prompt_tokens(self) -> list[int]:
        return [len(p) for p in self.prompt_ids]


def generated_prompts(filler_ids: list[int], n_tokens: int, tables: int) -> list[list[int]]:
    """`tables` prompts of exactly `n_tokens` ids each, cut from the filler at different offsets.

    Example: filler ids [1..10], n_tokens 4, tables 2 -> [[1, 2, 3, 4], [8, 9, 10, 1]].
    """
    if not filler_ids:
        raise EngineError("the filler text encoded to no tokens")
    out = []
    for table in range(tables):
        start = (table * GENERATED_STRIDE) % len(filler_ids)
        out.append([filler_ids[(start + i) % len(filler_ids)] for i in range(n_tokens)])
    return out


class MessageStream(Protocol):
    def __iter__(self) -> Iterator[dict]: ...

    def close(self) -> None: ...


class Host(Protocol):
    label: str  # how error lines name it: "the kitchen server at http://..."

    def about(self) -> dict: ...

    def limits(self, prompt_tokens: int, max_new_tokens: int) -> Limits: ...

    def check(self, form: OrderForm) -> CheckedOrder: ...

    def order(self, order: CheckedOrder) -> MessageStream: ...

    def lab(self, key: str, settings: Any) -> MessageStream: ...

    def board(self, order_id: str | None, since: int = -1) -> dict | None: ...

    def close(self) -> None: ...
