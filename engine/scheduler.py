"""The pass: before every step, decide which orders cook and how many of their tokens go in.

Three policies, one per lesson (select with `Engine.load(..., policy=...)`):

  static      a batch is admitted together when the kitchen is empty and runs until its last
              sequence finishes; later arrivals wait for the whole batch (the baseline).
  continuous  iteration-level: whenever a seat and KV memory are free, waiting prompts are
              admitted; a step is prefill-only or decode-only, and prefill goes first, so a long
              prompt stalls every running decode for a whole step (the interference lesson).
  chunked     each step has a token budget (default 512): every running decode gets its one
              token first, then prefill chunks fill what is left, all in one forward pass
              (Sarathi-Serve / vLLM V1). A long prompt is cut into chunks and the pot keeps going.

KV memory: running sequences may hold at most `kv_tokens` cached tokens together. A step that
would exceed it preempts the newest running sequence (its seat is freed; it goes back to the
front of the line and recomputes its tokens when readmitted). Continuous and chunked admit only
what fits; static admits a batch whose full length (prompt + max new tokens) fits, so it never
preempts.

Prefix reuse (`prefix`, engine/prefix_cache.py): an admitted request starts from the longest
prefix already cached in a running or a finished ("leftover") seat; leftovers are evicted, oldest
first, before anyone is preempted for a seat or for memory.

No starvation: the line is first come, first served, admission stops at the first order that
does not fit (a big order is never overtaken by smaller ones behind it), and preempted orders
rejoin at the front.

Worked example, chunked with a budget of 8: two sequences decoding and a 10-token prompt waiting.
  step 1: 2 decode tokens + the prompt's first 6 tokens      (8)
  step 2: 2 decode tokens + its last 4 -> it samples its 1st  (6)
  step 3: 3 decode tokens
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import EngineError
from engine.kv_pool import SeatPool
from engine.prefix_cache import Match, PrefixCache
from engine.sequence import Sequence, Status
from engine.speculative import ngram_draft

POLICIES = ("static", "continuous", "chunked")


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "continuous"
    max_seqs: int = 64  # sequences running at once (KV seats)
    token_budget: int = 512  # chunked: tokens per step; continuous: prompt tokens per prefill step
    kv_tokens: int = 0  # cached tokens all running sequences may hold together (0: the whole pool)

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise EngineError(f"unknown policy '{self.policy}' (choose {', '.join(POLICIES)})")
        if not isinstance(self.max_seqs, int) or self.max_seqs < 1:
            raise EngineError(f"max_seqs must be at least 1 (got {self.max_seqs})")
        if not isinstance(self.token_budget, int) or self.token_budget < 1:
            raise EngineError(f"token_budget must be at least 1 token (got {self.token_budget})")


@dataclass(frozen=True)
class Work:
    """One sequence's share of a step: feed tokens[start : start + length]. Made with `Work.of`,
    which fixes, at planning time, whether it is a decode and whether the pass samples for it.
    A speculating decode also feeds its `draft` after its last token (length = 1 + len(draft))."""

    seq: Sequence
    start: int
    length: int
    is_decode: bool
    samples: bool  # the pass reaches the sequence's last token, so it samples the next one
    draft: tuple[int, ...] = ()

    @classmethod
    def of(cls, seq: Sequence, length: int) -> Work:
        start = seq.num_cached
        return cls(seq, start, length, not seq.prefilling, start + length == len(seq.tokens))

    @classmethod
    def decode(cls, seq: Sequence, draft: list[int] | tuple[int, ...] = ()) -> Work:
        """One decode; a speculating one also feeds its draft to be checked in the same pass."""
        return cls(seq, seq.num_cached, 1 + len(draft), True, True, tuple(draft))

    @staticmethod
    def draft_room(seq: Sequence, seat_len: int) -> int:
        """Draft tokens this decode may propose: never past its max_new_tokens or its seat."""
        return max(0, min(seq.speculate, seq.max_new_tokens - seq.n_output - 1, seat_len - len(seq.tokens)))

    @property
    def fed(self) -> list[int]:
        """The token ids this work feeds."""
        return self.seq.tokens[self.start : self.start + self.length] if not self.draft else \
            [self.seq.tokens[self.start], *self.draft]  # fmt: skip


@dataclass
class StepPlan:
    work: list[Work] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def phase(self) -> str:
        kinds = {w.is_decode for w in self.work}
        return "mixed" if len(kinds) == 2 else "decode" if kinds == {True} else "prefill"


class Scheduler:
    """`work_bytes(tokens, longest)` is a prefill pass's working memory; every pass that holds
    prefill keeps it within `work_budget` (a pass with one prompt always goes: submit checked it)."""

    def __init__(self, config: SchedulerConfig, pool: SeatPool, work_bytes: Callable[[int, int], int],
                 work_budget: int, prefix: PrefixCache | None = None, drafter=None):  # fmt: skip
        config.check()
        self.config, self.pool, self.prefix = config, pool, prefix
        self.drafter = drafter  # engine.draft.Drafter: draft models besides prompt lookup (None: lookup only)
        self.work_bytes, self.work_budget = work_bytes, work_budget
        self.kv_tokens = config.kv_tokens or pool.seats * pool.seat_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def adopt(self, seq: Sequence) -> int:
        """Seat a sequence whose prompt was prefilled elsewhere (its K/V are copied in by the caller),
        straight into the running batch; its next step is a decode. Returns the seat."""
        if len(self.running) >= self.config.max_seqs:
            raise EngineError(f"no free seat: all {self.config.max_seqs} are cooking (max_seqs)")
        need = seq.num_cached + 1
        if self._fit(need) < need:
            raise EngineError(f"no KV memory for {need:,} tokens: {self.kv_tokens - self.tokens_held():,} free")
        seq.seat = self.prefix.take_seat(seq.request_id) if self.prefix is not None else self.pool.take(seq.request_id)
        seq.status = Status.RUNNING
        self.running.append(seq)
        return seq.seat

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the kitchen (finished or cancelled) and free its seat."""
        if seq in self.running:
            self.running.remove(seq)
            if self.prefix is not None and seq.num_cached and seq.reuse_prefix:
                self.prefix.keep(seq)  # its K/V stay as a leftover until the seat or memory is needed
            else:
                self.pool.release(seq.seat)
            seq.seat = None
        elif seq in self.waiting:
            self.waiting.remove(seq)

    # -- planning ---------------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        policy = self.config.policy
        if policy == "static":
            plan = self._decode() if self.running else self._admit(whole_batch=True)
        elif policy == "continuous":
            plan = self._admit() if self._room() else StepPlan()
            if not plan.work and self.running:
                plan = self._decode()
        else:
            plan = self._chunked()
        for w in plan.work:
            if w.seq.scheduled_t is None:
                w.seq.scheduled_t = now
        self._compact([w.seq for w in plan.work if w.is_decode and not w.draft])  # the rows read as one view
        return plan

    def _compact(self, decodes: list[Sequence]) -> None:
        """Seat the plain decodes in seats 0..B-1, so the step reads their KV as one view (prompt
        chunks and draft checks attend seat by seat, wherever they sit)."""
        if sorted(s.seat for s in decodes) == list(range(len(decodes))):
            return
        self.pool.compact([s.seat for s in decodes])
        seat_of = {rid: seat for seat, rid in enumerate(self.pool.owner) if rid is not None}
        for seq in self.running:
            seq.seat = seat_of[seq.request_id]

    def _room(self) -> bool:
        return bool(self.waiting) and len(self.running) < self.config.max_seqs

    def tokens_held(self) -> int:
        """Cached tokens held: the running sequences' and the leftovers'."""
        held = self.prefix.tokens_held if self.prefix is not None else 0
        return sum(s.num_cached for s in self.running) + held

    def _fit(self, need: int, keep: Match | None = None) -> int:
        """Evict leftovers (not the one `keep` adopts) until `need` more tokens fit; returns the room left."""
        while self.prefix is not None and self.tokens_held() + need > self.kv_tokens:
            if not self.prefix.evict(keep=keep.leftover if keep is not None else None):
                break
        return self.kv_tokens - self.tokens_held()

    def _match(self, seq: Sequence) -> Match | None:
        return self.prefix.find(seq, self.running) if self.prefix is not None else None

    def _take_seat(self, seq: Sequence, match: Match | None = None) -> None:
        self.waiting.popleft()
        seq.seat = self.prefix.reuse(seq, match) if self.prefix is not None else self.pool.take(seq.request_id)
        seq.status = Status.RUNNING
        self.running.append(seq)

    def _admit(self, whole_batch: bool = False) -> StepPlan:
        """Prefill-only step: waiting prompts, first come first served, whole prompts.

        `whole_batch` (static): admit as many as fit with their whole future length reserved, with
        no cap on the pass's tokens. Otherwise (continuous): the pass holds at most token_budget
        prompt tokens, though always at least one whole prompt.
        """
        plan, tokens = StepPlan(), 0
        reserved = longest = 0  # tokens this plan will add to the cache; the longest prompt in the pass
        while self.waiting and len(self.running) < self.config.max_seqs:
            seq = self.waiting[0]
            match = self._match(seq)
            n = seq.to_compute - (match.length if match is not None else 0)
            need = len(seq.tokens) - (match.length if match else 0) + seq.max_new_tokens if whole_batch else n
            if self._fit(reserved + need, match) < reserved + need:
                break
            if not whole_batch and plan.work and tokens + n > self.config.token_budget:
                break
            if plan.work and self.work_bytes(tokens + n, max(n, longest)) > self.work_budget:
                break
            self._take_seat(seq, match)
            plan.work.append(Work.of(seq, n))
            tokens, reserved, longest = tokens + n, reserved + need, max(longest, n)
        return plan

    def _decode(self) -> StepPlan:
        plan = StepPlan()
        self._make_room(len(self.running) + sum(s.speculate for s in self.running), plan)
        plan.work = self._decodes(self.running)
        return plan

    def _decodes(self, seqs: list[Sequence]) -> list[Work]:
        """One decode per sequence; the speculating ones get their drafts, every draft model's
        sequences batched together (engine/draft.py), prompt lookup for the rest."""
        if not any(s.speculate for s in seqs):  # the usual step: no drafts to plan
            return [Work.decode(s) for s in seqs]
        ks = [Work.draft_room(s, self.pool.seat_len) for s in seqs]
        if self.drafter is not None:
            drafts = self.drafter.propose(seqs, ks, {s.request_id for s in self.running})
        else:
            drafts = [ngram_draft(s.tokens, k) if k > 0 else [] for s, k in zip(seqs, ks, strict=True)]
        return [Work.decode(s, d) for s, d in zip(seqs, drafts, strict=True)]

    def _make_room(self, need: int, plan: StepPlan) -> None:
        """Evict leftovers, then preempt the newest running sequences, until `need` more tokens fit."""
        self._fit(need)
        while self.running and self.tokens_held() + need > self.kv_tokens:
            victim = self.running.pop()
            need -= 0 if victim.prefilling else 1
            self.pool.release(victim.seat)
            victim.reset_for_recompute()
            self.waiting.appendleft(victim)
            plan.preempted.append(victim)

    def _wok(self) -> int:
        """The step's token budget: the kitchen's, or smaller while the oldest prompt in the wok asks for a
        smaller wok (`Sequence.wok_tokens`, the Kitchen's wok-size lesson); such a pass always cooks a token."""
        first = next((s for s in self.running if s.prefilling), self.waiting[0] if self.waiting else None)
        asked = first.wok_tokens if first is not None else 0
        return min(asked, self.config.token_budget) if asked else self.config.token_budget

    def _chunked(self) -> StepPlan:
        plan = StepPlan()
        decodes = [s for s in self.running if not s.prefilling]
        self._make_room(len(decodes) + sum(s.speculate for s in decodes), plan)
        plan.work = self._decodes([s for s in self.running if not s.prefilling])  # after any preemption
        planned = sum(w.length for w in plan.work)  # tokens this step adds to the cache so far
        wok = self._wok()
        budget = wok - planned if wok == self.config.token_budget else max(1, wok - planned)
        free = self._fit(planned) - planned
        for seq in [s for s in self.running if s.prefilling]:  # chunks already under way, oldest first
            n = min(seq.to_compute, budget, free)
            if n <= 0:
                return plan
            plan.work.append(Work.of(seq, n))
            budget, free, planned = budget - n, free - n, planned + n
        while self._room() and budget > 0:
            seq = self.waiting[0]
            match = self._match(seq)
            todo = seq.to_compute - (match.length if match is not None else 0)
            n = min(todo, budget, self._fit(planned + min(todo, budget), match) - planned)
            if n <= 0:
                break
            self._take_seat(seq, match)
            plan.work.append(Work.of(seq, n))
            budget, planned = budget - n, planned + n
        return plan
