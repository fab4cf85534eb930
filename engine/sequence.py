"""One order in a busy kitchen: a request's state from arrival to its last token.

A `Sequence` is what the scheduler moves between its queues. It owns everything that belongs to
one request and nothing that belongs to the batch it happens to share a step with:

  tokens        prompt ids + the ids generated so far (the prompt is never re-tokenised)
  num_cached    how many of those tokens have K/V in the cache; the next pass feeds the rest
  seat          its row in the KV pool while it runs (None while it waits)
  generator     its own `torch.Generator`, so a seeded request samples the same tokens whatever
                else is in the batch
  times         arrival, first scheduling, each token's time, finish: its own metrics

Worked example: a prompt of 5 tokens, 3 new tokens wanted.
  submit            tokens=[p0..p4]        num_cached=0  status=waiting
  prefill (5)       tokens=[p0..p4, a]     num_cached=5  status=running   (a sampled from p4's logits)
  decode  (feeds a) tokens=[.., a, b]      num_cached=6
  decode  (feeds b) tokens=[.., a, b, c]   num_cached=7  status=finished  (3 new tokens)
If it is preempted after `b`, its seat is freed and num_cached goes back to 0; when it runs again
one prefill pass recomputes all 7 tokens and samples `c` from the last one's logits.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from engine.sampling import SamplingParams
from engine.speculative import SpecCounters
from engine.text import IncrementalDecoder


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass
class Sequence:
    request_id: int
    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    generator: torch.Generator
    stop_ids: frozenset[int]  # EOS ids that end it (empty when stop_at_eos is off)
    decoder: IncrementalDecoder
    arrival_t: float = field(default_factory=time.perf_counter)
    tokens: list[int] = field(default_factory=list)
    num_cached: int = 0
    seat: int | None = None
    status: Status = Status.WAITING
    finish_reason: str = ""  # "length", "stop", "cancelled"
    scheduled_t: float | None = None  # first time it entered a step (queue time ends here)
    token_times: list[float] = field(default_factory=list)
    finish_t: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens reused from a cached prefix (engine/prefix_cache.py)
    reused_from: int = -1  # the request that cooked that prefix (-1: none reused)
    speculate: int = 0  # draft tokens to propose per decode step (engine/speculative.py)
    draft: str = "ngram"  # who proposes them: prompt lookup, or a draft model's name (engine/draft.py)
    spec: SpecCounters = field(default_factory=SpecCounters)
    cancel_requested: bool = False
    reuse_prefix: bool = True  # False: every prompt token is computed, whatever the prefix cache holds
    wok_tokens: int = 0  # chunked: a pass holds at most this many tokens while this prompt cooks (0: the kitchen's budget)
    logprobs: int = -1  # -1: none; k >= 0: its Tokens carry their log-probability and k rivals
    min_tokens: int = 0  # EOS is masked out of its logits until it has this many new tokens

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt) :]

    @property
    def n_output(self) -> int:
        """len(output), without copying it (the decode loop asks every step)."""
        return len(self.tokens) - len(self.prompt)

    @property
    def to_compute(self) -> int:
        """Tokens the next passes must feed before this sequence can sample again."""
        return len(self.tokens) - self.num_cached

    @property
    def prefilling(self) -> bool:
        """True while its prompt (or, after preemption, its whole text) is not yet all in the cache."""
        return self.to_compute > 1 or not self.token_times

    @property
    def finished(self) -> bool:
        return self.status in (Status.FINISHED, Status.CANCELLED)

    def append(self, token: int, t: float) -> bool:
        """Add one sampled token at time `t`; True when it ends the sequence."""
        self.tokens.append(token)
        self.token_times.append(t)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        elif self.n_output >= self.max_new_tokens:
            self.finish_reason = "length"
        return bool(self.finish_reason)

    def reset_for_recompute(self) -> None:
        """Preempted: its KV is gone; it will recompute every token it has when it runs again."""
        self.num_cached, self.seat, self.status = 0, None, Status.WAITING
        self.preemptions += 1
