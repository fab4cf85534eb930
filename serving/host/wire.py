"""Everything that crosses a host's pipe, and the one codec that carries it: JSON with a registry of types.

The host (serving/host/process.py) and its loop (serving/host/loop.py) share one pipe; each side
dispatches what it receives through one table keyed by the message classes below. A key is the
host's name for a request, an order or a sweep (a string); the engine's request ids never leave
the loop.

    host -> loop:  Submit | Check | PlaceOrder | RunSweep | Cancel | Stop
    loop -> host:  Ready | LoadError (once, at the start), then Accepted | OrderAccepted | Refusal
                   (one per Submit or PlaceOrder), Checked | Refusal (one per Check), Steps (after
                   steps), SweepProgress ... SweepDone (one per RunSweep)

The codec: `encode(msg)` makes one JSON object of a message, `decode(raw)` reads it back. A value
inside is JSON as it is, or marked: a registered dataclass `{"__t": "Token", ...fields}`, a tuple
`{"__tuple__": [...]}`, a dict with other keys than strings `{"__dict__": [[k, v], ...]}`, a pandas
frame `{"__frame__": ...}`. Only types in the registry are rebuilt: this module registers the
messages and the engine's events and results, and the Lab registers its experiments' settings and
results (lab/registry.py). A type is found by its name in the registry, never imported by name,
so nothing a message says can load code. The HTTP routes use the same `to_json` / `from_json`
for the Kitchen's events and the Lab's results. Floats go through JSON's `repr` (exact); NaN and
infinity use Python's JSON extensions (both ends are this project).

    encode(Cancel("o3")) -> b'{"__t": "Cancel", "key": "o3"}';  decode(that) == Cancel("o3")
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from engine.events import Done, PrefillEnd, PrefillStart, Restart, StepEnd, Token, WokPass
from engine.limits import Limits
from engine.loader import ModelInfo
from engine.request_group import OrderResume
from engine.results import GenerationResult, RequestMetrics, RequestOutput
from engine.serving_core import ServingLimits
from engine.speculative import SpecCounters
from engine.trace import Metrics, StepRecord, Trace
from serving.host.api import CheckedOrder, OrderForm

MARKERS = ("__t", "__tuple__", "__dict__", "__frame__")
REGISTRY: dict[str, type] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}
_INIT: dict[type, frozenset[str]] = {}  # the fields a class's constructor takes
_PLAIN = frozenset((str, int, float, bool, type(None)))


def register(*classes: type) -> None:
    """Let these dataclasses cross the pipe (and the HTTP routes), known by their class name."""
    for cls in classes:
        if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
            raise TypeError(f"{cls!r} is not a dataclass")
        held = REGISTRY.get(cls.__name__)
        if held is not None and held is not cls:
            raise TypeError(f"two types named {cls.__name__} ({held.__module__}, {cls.__module__}): one name per concept")
        REGISTRY[cls.__name__] = cls
        _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
        _INIT[cls] = frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def register_module(module) -> None:
    """Register every dataclass `module` defines (not those it imports)."""
    register(*[v for v in vars(module).values()
               if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == module.__name__])  # fmt: skip


def to_json(obj: Any) -> Any:
    """`obj` as plain JSON values. Raises TypeError naming what cannot travel.

    Every step of a streaming request crosses here, so a plain value is taken as it is without a
    call (measured: a step of 64 tokens encodes in a third of the time it took with a call each)."""
    t = type(obj)
    if t in _PLAIN:
        return obj
    if t is list:
        return [v if type(v) in _PLAIN else to_json(v) for v in obj]
    if t is tuple:
        return {"__tuple__": [v if type(v) in _PLAIN else to_json(v) for v in obj]}
    if t is dict:
        if all(type(k) is str and k not in MARKERS for k in obj):
            return {k: v if type(v) in _PLAIN else to_json(v) for k, v in obj.items()}
        return {"__dict__": [[to_json(k), to_json(v)] for k, v in obj.items()]}
    names = _FIELDS.get(t)
    if names is not None:
        out = {"__t": t.__name__}
        for name in names:
            v = getattr(obj, name)
            out[name] = v if type(v) in _PLAIN else to_json(v)
        return out
    if isinstance(obj, str):  # a str of another type (torch's version string): its text
        return str(obj)
    if isinstance(obj, bool | int | float):  # an int or a float of another type
        return bool(obj) if isinstance(obj, bool) else int(obj) if isinstance(obj, int) else float(obj)
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:  # a numpy scalar
        return obj.item()
    if t.__name__ == "DataFrame":
        return {"__frame__": to_json(obj.to_dict(orient="list"))}
    raise TypeError(f"a {t.__module__}.{t.__qualname__} cannot travel: it is not a registered type (serving/host/wire.py)")


def from_json(obj: Any) -> Any:
    """The value `to_json` was given. Raises ValueError naming what is wrong."""
    t = type(obj)
    if t is list:
        return [v if type(v) in _PLAIN else from_json(v) for v in obj]
    if t is not dict:
        return obj
    name = obj.get("__t")
    if name is not None:
        cls = REGISTRY.get(name)
        if cls is None:
            raise ValueError(f"'{name}' is not a type this side knows (another version of Two-Pot Kitchen, or a "
                             "Lab result where the Lab is not loaded)")  # fmt: skip
        values = {k: v if type(v) in _PLAIN else from_json(v) for k, v in obj.items() if k != "__t"}
        init = _INIT[cls]
        later = [k for k in values if k not in init]
        try:
            out = cls(**{k: v for k, v in values.items() if k in init}) if later else cls(**values)
        except TypeError as err:
            raise ValueError(f"a malformed {name}: {err}") from None
        for k in later:
            object.__setattr__(out, k, values[k])
        return out
    if "__tuple__" in obj:
        return tuple([v if type(v) in _PLAIN else from_json(v) for v in obj["__tuple__"]])
    if "__dict__" in obj:
        return {from_json(k): from_json(v) for k, v in obj["__dict__"]}
    if "__frame__" in obj:
        import pandas as pd  # lazy: only a Lab result carries a frame

        return pd.DataFrame(from_json(obj["__frame__"]))
    return {k: v if type(v) in _PLAIN else from_json(v) for k, v in obj.items()}


def encode(msg: Any) -> bytes:
    """One message as the bytes that cross the pipe. Raises TypeError for what cannot travel."""
    if type(msg) not in MESSAGES:
        raise TypeError(f"a {type(msg).__name__} is not a message between a host and its loop")
    return json.dumps(to_json(msg)).encode()


def decode(raw: bytes) -> Any:
    """The message `encode` made. Raises ValueError naming what is wrong."""
    msg = from_json(json.loads(raw))
    if type(msg) not in MESSAGES:
        raise ValueError(f"not a message between a host and its loop: {raw[:80]!r}")
    return msg


# -- what the messages carry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadyInfo:
    """The loaded kitchen, once: the model, its shape, and what one order may ask of it."""

    model: str
    device: str
    dtype: str  # the precision: a dtype, or "int8" (int8 matrices, float32 the rest)
    policy: str
    max_context: int
    vocab_size: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    load_s: float
    model_info: ModelInfo
    serving: ServingLimits  # seats, their length, the KV tokens they share
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
    keys: tuple[str, ...] = ()  # the requests in the step, by the host's keys (the class board)
    wall_t: float = 0.0  # time.time() when the step ended (steps may reach the host in batches)


@dataclass(frozen=True)
class QueueState:
    """The scheduler after a step: the server's gauges and prefix-cache counters."""

    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV memory held (running sequences and leftovers)
    prefix_queries: int = 0  # prompt tokens looked up, since the engine started
    prefix_hits: int = 0


@dataclass(frozen=True)
class StepNews:
    """What one step did, for the host:
    - tokens: `(key, token_id, text, index, finished, ttft_s, logprobs)` per request token; ttft_s on
      a request's first token (its arrival in the loop -> the end of the step that made it), else
      None; logprobs None, or `(token text, logprob, ((rival text, logprob), ...))` when asked;
    - done: `(key, RequestOutput)` per finished request;
    - orders: `(key, [engine events], end)` per Kitchen order with news: the order's own events
      (engine/request_group.py), end None while it cooks, then "done" or "cancelled".
    `info` is None for a step that only applied cancellations."""

    info: StepInfo | None
    tokens: list
    done: list
    state: QueueState
    orders: list


# -- host -> loop ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """One request: `prompt` is text or token ids, `settings` the engine's (temperature, seed, ...).
    `resume`: the tokens a previous engine process already streamed for this key; the loop cooks
    prompt + resume as the prompt, its sampler advanced past them (serving/host/recovery.py)."""

    key: str
    prompt: Any
    max_new_tokens: int
    settings: dict
    resume: list = field(default_factory=list)


@dataclass(frozen=True)
class Check:
    """An order's one question before it cooks: its token ids, within the engine's limits."""

    key: str
    form: OrderForm


@dataclass(frozen=True)
class PlaceOrder:
    """A checked order: its tables join the batch as requests "key/0", "key/1", ... (engine/request_group.py).
    `resume`: what a previous engine process served of it; the loop goes on from there (serving/host/recovery.py)."""

    key: str
    prompt_ids: list
    max_new_tokens: int
    settings: dict
    resume: OrderResume | None = None


@dataclass(frozen=True)
class RunSweep:
    """A Lab sweep, run between orders on an engine of the sweep's own in the loop's process: the
    experiment `experiment` of the Lab's registry (the sweeps the host was started with)."""

    key: str
    experiment: str
    settings: Any


@dataclass(frozen=True)
class Cancel:
    """Cancel a request, a whole order or a sweep."""

    key: str


@dataclass(frozen=True)
class ClearLeftovers:
    """Drop the leftovers (prefix cache) these engine requests cooked."""

    origins: tuple[int, ...]


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
class Checked:
    key: str
    prompt_ids: list  # per table


@dataclass(frozen=True)
class Refusal:
    key: str
    line: str  # the engine's one-line refusal


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
    steps: list[StepNews]  # the steps since the last message


TO_LOOP = (Submit, Check, PlaceOrder, RunSweep, Cancel, ClearLeftovers, Stop)
TO_HOST = (Ready, LoadError, Accepted, OrderAccepted, Checked, Refusal, SweepProgress, SweepDone, Steps)
MESSAGES = frozenset(TO_LOOP + TO_HOST)

register(*TO_LOOP, *TO_HOST, ReadyInfo, StepInfo, QueueState, StepNews, OrderForm, CheckedOrder, OrderResume,
         PrefillStart, WokPass, PrefillEnd, Token, StepEnd, Restart, Done, StepRecord, Trace, Metrics, GenerationResult,
         RequestOutput, RequestMetrics, SpecCounters, ModelInfo, ServingLimits, Limits)  # fmt: skip
