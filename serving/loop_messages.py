"""What a kitchen host and its kitchen loop say to each other: every message, one dataclass each.

The host (serving/engine_client.py) and the loop (serving/kitchen_loop.py) share one socket pair;
each side dispatches what it receives through one table keyed by these classes. A key is the
host's name for a request or an order (a string); the engine's request ids never leave the loop.

    host -> loop:  Submit | PlaceOrder | Ask | RunSweep | Cancel | Stop
    loop -> host:  Ready | LoadError (once, at the start), then Accepted | OrderAccepted | Refusal
                   (one per Submit or PlaceOrder), AskReply (one per Ask), Steps (after steps),
                   SweepProgress ... SweepDone (one per RunSweep)

On the pipe every message is one JSON object, `{"type": class name, ...its fields}`, made and
read by `encode` / `decode` below (the only serialisation between the two processes; never
pickle). Plain fields are JSON as they are; what a field carries beyond that (a Lab sweep's
settings and records, an order form's answer, a finished request's result) goes through
serving/lab_wire.py's marked JSON, and a step's order events are already serving/order_wire.py's
dicts.

    encode(Cancel("o3")) -> b'{"type": "Cancel", "key": "o3"}';  decode(that) == Cancel("o3")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from serving import lab_wire

# Test hooks, read from the environment: a test's slow engine (the loop pauses this many seconds
# after every step) and the watchdog's floor in seconds (serving/engine_client.py).
TEST_HANG_ENV = "TWO_POT_TEST_HANG_S"
SILENCE_ENV = "TWO_POT_SILENCE_S"

# -- what the messages carry ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoopSettings:
    """What the kitchen loop loads and how it schedules (`two-pot-kitchen serve`'s options)."""

    model: str = "chef"
    device: str = "cpu"
    dtype: str = "float32"
    policy: str = "chunked"
    token_budget: int = 512
    max_seqs: int = 64
    threads: int = 0  # 0: torch's default
    prefix_cache: bool = True  # a class's orders often share a system prompt
    cores: tuple[int, ...] = ()  # pin the loop's process to these cores (serving/cores.py); () = any
    max_seq_len: int | None = None  # a seat's tokens (prompt + reply); None: the engine's default (both capped by the context)
    batch_invariant: bool = False  # every answer the same bits as its prompt served alone (engine/invariance.py)


@dataclass(frozen=True)
class ReadyInfo:
    model: str
    device: str
    dtype: str
    policy: str
    max_context: int
    vocab_size: int
    seats: int
    kv_tokens: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    load_s: float
    model_info: dict | None = None  # engine.loader.ModelInfo as a dict (the Kitchen's caption and costs)
    token_budget: int = 0
    batch_invariant: bool = False


@dataclass(frozen=True)
class StepInfo:
    """One step of the kitchen, for the server's metrics and each token's `timings`."""

    index: int
    phase: str  # "prefill", "decode" or "mixed"
    seconds: float
    batch: int
    prefill_tokens: int
    decode_tokens: int
    kv_bytes: int
    keys: tuple[str, ...] = ()  # the requests in the step, by the parent's keys (the class board)
    wall_t: float = 0.0  # time.time() when the step ended (steps may reach the server in batches)


@dataclass(frozen=True)
class QueueState:
    """The scheduler after a step: the server's gauges and prefix-cache counters."""

    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV memory held (running sequences and leftovers)
    prefix_queries: int = 0  # prompt tokens looked up, since the engine started
    prefix_hits: int = 0


# -- host -> loop ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """One request: `prompt` is text or token ids, `settings` the engine's (temperature, seed, ...)."""

    key: str
    prompt: Any
    max_new_tokens: int
    settings: dict


@dataclass(frozen=True)
class PlaceOrder:
    """The Kitchen's order: its tables join the batch as requests "key/0", "key/1", ...
    (engine/request_group.py)."""

    key: str
    prompts: list
    max_new_tokens: int
    settings: dict


@dataclass(frozen=True)
class Ask:
    """An order form's question, answered between two steps: "limits" (prompt_len, max_new) or
    "check" (prompts, max_new, settings)."""

    key: str
    question: str
    args: tuple


@dataclass(frozen=True)
class RunSweep:
    """A Lab sweep, run between orders: `module.name(engine, settings, emit)` on an engine of the
    sweep's own in the loop's process (loaded with the engine's defaults: the lessons measure
    those, not the class's scheduling). The function travels by name and the settings as a
    dataclass of this project's (serving/lab_wire.py), read once `path` (the host's import path)
    is on the loop's."""

    key: str
    module: str
    name: str
    settings: Any
    path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cancel:
    """Cancel a request or a whole order."""

    key: str


@dataclass(frozen=True)
class Stop:
    """Finish and exit."""


# -- loop -> host ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    info: ReadyInfo  # once the engine is loaded and warmed up


@dataclass(frozen=True)
class LoadError:
    line: str  # instead of Ready; the loop exits


@dataclass(frozen=True)
class Accepted:
    key: str
    prompt_tokens: int


@dataclass(frozen=True)
class OrderAccepted:
    key: str
    prompt_tokens: list[int]  # per table


@dataclass(frozen=True)
class Refusal:
    key: str
    line: str  # the engine's one-line refusal


@dataclass(frozen=True)
class AskReply:
    key: str
    ok: bool
    value: Any  # a dict (limits), token-id lists (check), or the refusal line when not ok


@dataclass(frozen=True)
class SweepProgress:
    key: str
    record: Any  # what the sweep emitted (a finished point)


@dataclass(frozen=True)
class SweepDone:
    key: str
    ok: bool
    value: Any  # the sweep's result, or its one-line error


@dataclass(frozen=True)
class Steps:
    """The steps since the last message, each `(StepInfo | None, tokens, done, QueueState, orders)`:
    - tokens: `[(key, token_id, text, index, finished, ttft_s, logprobs)]`, ttft_s on a request's
      first token (its arrival in the loop -> the end of the step that made it), else None;
      logprobs None, or `(token text, logprob, ((rival text, logprob), ...))` for a request that asked;
    - done: `[(key, RequestOutput)]`;
    - orders: `[(key, [event dicts], end)]`, the Kitchen's orders' own engine events
      (serving/order_wire.py), end None while one cooks, then "done" or "cancelled".
    StepInfo is None for a step that only applied cancellations."""

    steps: list[tuple]


TO_LOOP = (Submit, PlaceOrder, Ask, RunSweep, Cancel, Stop)
TO_HOST = (Ready, LoadError, Accepted, OrderAccepted, Refusal, AskReply, SweepProgress, SweepDone, Steps)

BY_NAME = {cls.__name__: cls for cls in TO_LOOP + TO_HOST}


# -- the wire: one JSON object per message ---------------------------------------------------------------------


def encode(msg: Any) -> bytes:
    """One message as the bytes that cross the pipe."""
    cls = type(msg)
    if cls is Ready:
        body = {"info": asdict(msg.info)}
    elif cls is Steps:
        body = {"steps": [_step_out(*step) for step in msg.steps]}
    else:
        body = {f.name: lab_wire.encode(getattr(msg, f.name)) for f in fields(msg)}
    return json.dumps({"type": cls.__name__, **body}).encode()


def decode(raw: bytes) -> Any:
    """The message `encode` made. Raises ValueError naming what is wrong."""
    d = json.loads(raw)
    cls = BY_NAME.get(d.pop("type", None) if isinstance(d, dict) else None)
    if cls is None:
        raise ValueError(f"not a kitchen-loop message: {raw[:80]!r}")
    if cls is Ready:
        return Ready(ReadyInfo(**d["info"]))
    if cls is Steps:
        return Steps([_step_in(*step) for step in d["steps"]])
    return cls(**{k: lab_wire.decode(v) for k, v in d.items()})


def _step_out(info: StepInfo | None, tokens: list, done: list, state: QueueState, orders: list) -> list:
    # Every step of a streaming request crosses here: shallow `vars`, results through lab_wire.
    return [None if info is None else vars(info), tokens, [[key, lab_wire.encode(res)] for key, res in done],
            vars(state), orders]  # fmt: skip


def _step_in(info: dict | None, tokens: list, done: list, state: dict, orders: list) -> tuple:
    """JSON has no tuples: a step's keys, each token and its logprobs come back as the tuples sent."""
    step = None if info is None else StepInfo(**(info | {"keys": tuple(info["keys"])}))
    toks = [(*t[:6], None if t[6] is None else (t[6][0], t[6][1], tuple(tuple(r) for r in t[6][2]))) for t in tokens]
    ends = [(key, lab_wire.decode(res)) for key, res in done]
    return step, toks, ends, QueueState(**state), [(key, events, end) for key, events, end in orders]
