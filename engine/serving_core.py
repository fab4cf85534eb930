"""The serving path's state: what it was sized to and what it holds.

`Engine` (engine/engine.py) builds one `Serving` at its first `submit()`: the KV seats
(engine/kv_pool.py), the scheduler that picks who cooks (engine/scheduler.py) and the runner that
cooks one pass (engine/runner.py), sized as its `ServingLimits` say: from the memory budget
(`budget_limits`), or to hold one order exactly (`order_limits`, for `Engine.generate`/`stream`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from engine.compiled import CompiledDecode
from engine.costs import prefill_work_bytes
from engine.draft import Drafter
from engine.kv_pool import SeatPool
from engine.model import Transformer
from engine.native import NativeStep, step_label
from engine.prefix_cache import PrefixCache
from engine.runner import Runner
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.settings import EngineSettings

DEFAULT_SEAT_LEN = 2048  # a seat's slots when max_seq_len is not given (capped by the context)
POOL_SHARE = 0.75  # of the memory budget for the KV seats; the rest is prefill working memory


DecodeStep = CompiledDecode | NativeStep


def make_decode_step(model: Transformer, cfg: EngineSettings) -> DecodeStep | None:
    """What runs the runner's passes: torch.compile when asked (pure-decode steps), else the native
    step on CPU (every pass, unless `native=False`), else None: the model's forward, one op at a time."""
    if cfg.compile:
        return CompiledDecode(model, cfg.compile_max_batch)
    if cfg.native and model.device.type == "cpu" and not cfg.batch_invariant:
        return NativeStep(model)
    return None


def describe_decode_step(step: DecodeStep | None) -> str:
    """How the passes run, in words the Kitchen shows: "native (AVX-512 VNNI)" (one C call a pass,
    built for that instruction set), "compiled (torch.compile)", or "op by op: <why>"."""
    if isinstance(step, CompiledDecode):
        return "compiled (torch.compile)" if step.failure is None else f"op by op: {step.failure}"
    if isinstance(step, NativeStep):
        return step_label(step)
    return "op by op: the model's forward"


@dataclass(frozen=True)
class ServingLimits:
    """What the serving path was sized to, from the memory budget (see `Engine.serving_limits`)."""

    seats: int  # sequences that can run at once
    seat_len: int  # prompt + new tokens of one request
    kv_tokens: int  # cached tokens all running sequences may hold together
    pool_bytes: int  # KV seats reserved
    work_bytes: int  # left for a prefill pass's working memory
    budget_bytes: int


@dataclass(frozen=True)
class ServingState:
    """The kitchen right now: for a server's gauges (`Engine.serving_state`)."""

    running: int
    waiting: int
    kv_tokens_used: int  # held by running sequences and leftovers
    kv_tokens: int
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache (vLLM's definition)
    prefix_hits: int = 0  # of those, tokens found cached

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV memory the running sequences hold (vLLM's kv_cache_usage_perc)."""
        return self.kv_tokens_used / self.kv_tokens if self.kv_tokens else 0.0


def budget_limits(model: Transformer, config: EngineSettings, budget: int) -> ServingLimits:
    """Seats and their length from the memory budget: `POOL_SHARE` of it for the seats, the rest
    for a prefill pass's working memory."""
    per_token = model.cfg.kv_bytes_per_token(model.dtype.itemsize)
    seat_len = min(config.max_seq_len or DEFAULT_SEAT_LEN, model.cfg.max_context)
    pool_budget = int(budget * POOL_SHARE)
    seats = max(1, min(config.max_seqs, pool_budget // (seat_len * per_token)))
    seat_len = max(1, min(seat_len, pool_budget // (seats * per_token)))
    pool = seats * seat_len * per_token
    return ServingLimits(seats, seat_len, config.kv_tokens or seats * seat_len, pool, budget - pool, budget)


def order_limits(model: Transformer, lengths: list[int], max_new_tokens: int, seats: int) -> ServingLimits:
    """A kitchen for one order alone, whose memory `Engine.check` already held against the budget.

    Its tables are admitted in one pass (the static policy): a seat each (`seats` may be more: a
    CUDA graph's bucket, for its padding rows), each of the longest prompt + max_new_tokens - 1
    slots (the last token is never fed back), KV memory for every table at the longest length,
    and working memory for the one prefill pass over every prompt.

    Worked example: prompts of 5 and 3 tokens, 4 new tokens: 2 seats of 8 slots, 18 KV tokens,
    the working memory of a 8-token pass whose longest prompt is 5.
    """
    cfg, itemsize = model.cfg, model.dtype.itemsize
    seat_len = max(lengths) + max_new_tokens - 1
    pool = seats * seat_len * cfg.kv_bytes_per_token(itemsize)
    work = prefill_work_bytes(cfg, sum(lengths), max(lengths), itemsize)
    return ServingLimits(seats, seat_len, len(lengths) * (seat_len + 1), pool, work, pool + work)


class Serving:
    """The serving path's state: seats, scheduler, runner, and the live sequences by id."""

    def __init__(self, model: Transformer, config: EngineSettings, limits: ServingLimits,
                 compiled: DecodeStep | None, cuda_graphs: bool):  # fmt: skip
        """`cuda_graphs`: the runner replays decode graphs per batch bucket (engine/cuda_graph.py)."""
        self.limits = limits
        self.pool = SeatPool(model.cfg, limits.seats, limits.seat_len, model.dtype, model.device)
        sched = SchedulerConfig(config.policy, limits.seats, config.token_budget, limits.kv_tokens)
        self.prefix = PrefixCache(self.pool) if config.prefix_cache else None
        self.drafter = Drafter(limits.seats, limits.seat_len)  # draft models load at the first submit that names one
        # a function of the model alone, not a method: the scheduler holding a bound method would make
        # a reference cycle, and an order's seats would wait for the garbage collector to be freed
        self.work_bytes = functools.partial(prefill_work_bytes, model.cfg, dtype_bytes=model.dtype.itemsize)
        self.scheduler = Scheduler(sched, self.pool, self.work_bytes, limits.work_bytes, self.prefix, self.drafter)
        self.runner = Runner(model, self.pool, cuda_graphs, compiled, config.batch_invariant)
        self.model = model
        self.seqs: dict[int, Sequence] = {}  # every request not yet Done, by id
        self.cancelled: list[Sequence] = []  # cancel() asked; applied at the next step
        self.extras: set[int] = set()  # live requests with logprobs or min_tokens (a step checks only these)
