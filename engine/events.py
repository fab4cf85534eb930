"""Typed events that `Engine.stream()` yields while a request runs.

A UI thread animates from these: the wok lights on `PrefillStart`, the KV cache slides onto the
counter at `PrefillEnd`, one bowl is ladled per `Token`, and `Done` carries the full result.
Every event carries `t` = seconds since the request started (measured, never estimated).

Order for one request:
    PrefillStart, PrefillEnd, Token x batch (first tokens), StepEnd(prefill),
    then per decode step: Token x running sequences, StepEnd(decode), ... and finally Done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.trace import StepRecord

if TYPE_CHECKING:  # avoid an import cycle; the engine module imports this one
    from engine.engine import GenerationResult


@dataclass(frozen=True)
class PrefillStart:
    t: float
    batch: int
    prompt_tokens: list[int]  # prompt length of each sequence
    slots: int  # positions the pass will compute (padding included)
    mode: str  # "padded" or "packed"


@dataclass(frozen=True)
class PrefillEnd:
    t: float
    step: StepRecord  # the prefill pass, with its measured time and analytic cost
    kv_bytes: int  # KV cache bytes handed to decode (the serving counter)


@dataclass(frozen=True)
class Token:
    t: float
    seq: int  # index of the sequence in the request's batch
    step: int  # 0 for the token sampled from prefill's logits, then 1, 2, ...
    token_id: int
    text: str  # newly printable text for this sequence ("" while a UTF-8 char is incomplete)
    finished: bool  # this token ended the sequence (EOS or max_new_tokens)


@dataclass(frozen=True)
class StepEnd:
    t: float
    step: StepRecord


@dataclass(frozen=True)
class Done:
    t: float
    result: GenerationResult


Event = PrefillStart | PrefillEnd | Token | StepEnd | Done
