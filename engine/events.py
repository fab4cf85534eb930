"""Typed events: what `Engine.stream()` yields and `Engine.step()` returns.

A UI thread animates from these: the wok lights on `PrefillStart`, the KV cache slides onto the
counter at `PrefillEnd`, one bowl is ladled per `Token`, and `Done` carries the full result.
Every event carries `t` = seconds since the request started (measured, never estimated).

Every event carries `request_id`.

Order for one order (`stream`; `seq` is the table's index in the order):
    PrefillStart, PrefillEnd, Token x batch (first tokens), StepEnd(prefill),
    then per decode step: Token x running sequences, StepEnd(decode), ... and finally Done.

What one `step()` of the scheduler returns: a Token for each request that sampled in that step
(`step` counts that request's own tokens, 0 = its first), a Done for each request that finished
or was cancelled, and one StepEnd for the pass with the requests it held (`request_id` -1: a step
belongs to no single request). Times `t` are seconds on the engine's clock there.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.results import GenerationResult, RequestOutput
from engine.trace import StepRecord


@dataclass(frozen=True)
class PrefillStart:
    t: float
    batch: int
    prompt_tokens: list[int]  # prompt length of each sequence
    slots: int  # positions the pass will compute (padding included)
    mode: str  # "padded" or "packed"
    request_id: int = 0


@dataclass(frozen=True)
class WokPass:
    """One pass of an order's wok, when its prompts took several (a shared kitchen's token budget, seats
    or memory): sent as each pass but the last ends, and all of them listed in the `PrefillEnd` that
    closes the wok, so a page draws the tosses the kitchen really made (an order cooked in one pass
    sends none). Example: 4 prompts of 2,048 tokens, a wok of 512 tokens a toss -> 16 passes."""

    t: float  # the pass's end, on the order's clock
    index: int  # 1, 2, ... among the order's wok passes
    t_start: float
    tokens: int  # this order's prompt tokens the pass cooked
    pass_tokens: int  # every token the pass computed (other orders' prompts and bowls ladled alongside included)
    first_bowls: int  # this order's tables whose first token came out of this pass
    request_id: int = 0


@dataclass(frozen=True)
class PrefillEnd:
    t: float
    step: StepRecord  # the prefill pass, with its measured time and analytic cost
    kv_bytes: int  # KV cache bytes handed to decode (the serving counter)
    request_id: int = 0
    passes: tuple[WokPass, ...] = ()  # the wok's passes when it took more than one (see WokPass)


@dataclass(frozen=True)
class Token:
    t: float
    seq: int  # index of the sequence in the request's batch
    step: int  # 0 for the token sampled from prefill's logits, then 1, 2, ...
    token_id: int
    text: str  # newly printable text for this sequence ("" while a UTF-8 char is incomplete)
    finished: bool  # this token ended the sequence (EOS or max_new_tokens)
    request_id: int = 0
    # Served requests that asked for logprobs: log-softmax of the model's logits (before temperature,
    # top-p or min_tokens' mask) at this token, and the k likeliest (token id, logprob), best first.
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class StepEnd:
    t: float
    step: StepRecord
    request_id: int = 0  # the order's id; -1 for a scheduler step
    request_ids: tuple[int, ...] = ()  # scheduler step: the requests it held
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preempted: tuple[int, ...] = ()  # scheduler step: requests sent back to the line to recompute


@dataclass(frozen=True)
class Restart:
    """The engine process died (or was stopped as hung) while this order cooked, and a fresh one
    took it over: the tokens already served stay, and the order goes on from them (its next pass
    recomputes their KV cache). A host sends it, not an engine (serving/host/process.py).

    Example: 4 tables, 12 tokens each served when the process was killed 0.84 s into the order ->
    Restart(t=0.84, why="... stopped (exit code -9) ...", kept=48)."""

    t: float  # on the order's clock
    why: str  # what happened to the process, in one line
    kept: int  # tokens already served, over every table, that the order goes on from
    request_id: int = 0


@dataclass(frozen=True)
class Done:
    t: float
    result: GenerationResult | RequestOutput
    request_id: int = 0


Event = PrefillStart | WokPass | PrefillEnd | Token | StepEnd | Restart | Done
