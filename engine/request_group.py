"""B requests followed as one: an order's tables, submitted to an engine and told as one story.

The Kitchen page orders B tables at once and draws them as one order: the wok's pass, the KV handed
to the counter, one bowl per table per soup-pot step, and a `GenerationResult` at the end. The
order's tables are submitted as B ordinary requests (`Engine.submit`) and a `RequestGroup` picks
the order's own story out of each `Engine.step()`. Two kitchens cook this way:

  * the class kitchen (serving/host/loop.py): other students' requests share every pass;
  * `Engine.generate` / `Engine.stream`: an engine sized for the order alone steps it (`follow`).

What the group tells:

  * `Token` per table (`seq` = the table's index), at the order's clock (seconds since it arrived);
  * the order's wok: every pass in which one of its tables still had prompt to compute. Usually one
    pass; a prompt larger than the kitchen's token budget, or tables waiting for a seat, take
    several. They are folded into ONE prefill record spanning them (their times, tokens and
    analytic costs added up), so TTFT, the wok's time and the panels keep their meaning; the trace
    notes how many passes it took;
  * the order's soup pot: every later pass that decoded its tables, one `StepEnd` each.

A record keeps the whole pass's batch, tokens and costs (the pot holds everyone's bowls, and the
time is the pass's), except `kv_bytes`, which counts this order's tables only.

Worked example: 2 tables of 5 prompt tokens, 3 new tokens each, on a kitchen already decoding one
other request. Pass 1 (mixed: 10 prompt tokens + 1 decode): both tables' first tokens, the order's
prefill record with batch 3. Passes 2 and 3 (decode, batch 3): a token per table each. The order
sees PrefillStart, PrefillEnd, 2 Tokens, StepEnd(prefill), then 2 Tokens + StepEnd(decode) twice,
then Done with a `GenerationResult` whose tokens equal `Engine.generate` on the same prompts.

Sampling: table i samples with its own generator seeded `seed + i`, so a table's tokens never
depend on its neighbours: they are the tokens of its prompt served alone with seed + i.

A fresh engine process can go on with an order its predecessor was cooking (`OrderResume`, sent
by serving/host/recovery.py): each unfinished table cooks its prompt + the tokens already served
as its prompt, for the tokens still owed, its generator past their draws, and the order's story
goes on where the host last heard it: the same clock, the same trace, token indices counting on.
The pass that recomputes their K/V is one more pass of the order's pot (as for a preempted table),
so TTFT stays the one the client saw and the restart's cost shows as one long gap between tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from engine.errors import EngineError
from engine.events import Done, Event, PrefillEnd, PrefillStart, StepEnd, Token, WokPass
from engine.limits import Limits, RequestSettings, check_request
from engine.results import GenerationResult
from engine.sampling import skip_draws
from engine.serving_core import ServingLimits
from engine.text import encode_prompts
from engine.trace import StepRecord, Trace

ORDER_SETTINGS = ("temperature", "top_k", "top_p", "seed", "stop_at_eos", "reuse_prefix", "wok_tokens")  # what a shared order may set


def shared_limits(engine, prompt_len: int, max_new_tokens: int) -> Limits:
    """What one order may ask of the shared kitchen `engine` (see `order_room`)."""
    return order_room(engine.serving_limits(), engine.cfg.max_context, engine.info.kv_bytes_per_token,
                      prompt_len, max_new_tokens)  # fmt: skip


def order_room(lim: ServingLimits, max_context: int, kv_bytes_per_token: int, prompt_len: int,
               max_new_tokens: int) -> Limits:  # fmt: skip
    """What one order may ask of a shared kitchen of this shape: its seats and the KV memory they
    share. Arithmetic on the shape alone, so a host answers it without asking its engine.

    Example (the chef's class kitchen: 64 seats of 512 tokens, 40,000 KV tokens): prompt 100 + 64
    new -> at most min(64, 40,000 // 164) = 64 tables, each seat holding 163 tokens of them (the
    last token is never fed back, so prompt + new tokens may reach the seat's length + 1).
    """
    per_seq = max(prompt_len + max_new_tokens, 1)
    return Limits(
        max_batch=min(lim.seats, lim.kv_tokens // per_seq),
        max_context=min(max_context, lim.seat_len + 1),  # the last token is never fed back
        kv_budget_bytes=lim.kv_tokens * kv_bytes_per_token,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_bytes_per_sequence=per_seq * kv_bytes_per_token,
        seats=lim.seats,
    )


def shared_check(engine, prompts: list, max_new_tokens: int, **settings) -> list[list[int]]:
    """Validate an order for the shared kitchen without running it; returns its prompts as ids.
    Every refusal is one line naming the limit (the same rules `RequestGroup` meets at submit)."""
    bad = next((k for k in settings if k not in ORDER_SETTINGS), None)
    if bad is not None:
        raise EngineError(f"setting '{bad}' does not apply to an order in a shared kitchen "
                          f"(it takes {', '.join(ORDER_SETTINGS)})")  # fmt: skip
    ids = encode_prompts(prompts, engine.codec)
    req = RequestSettings(max_new_tokens=max_new_tokens, **settings)
    lim = shared_limits(engine, max(map(len, ids), default=1), max_new_tokens)
    check_request(engine.cfg, ids, req, lim)
    if max(map(len, ids)) + max_new_tokens > lim.max_context:
        raise EngineError(f"a prompt of {max(map(len, ids)):,} tokens + {max_new_tokens:,} new tokens exceeds a KV "
                          f"seat of {lim.max_context:,} tokens in this kitchen")  # fmt: skip
    return ids


@dataclass(frozen=True)
class OrderResume:
    """An order as the host last heard of it, for the fresh engine process that goes on with it.

    Example: 2 tables of 5 prompt tokens, 8 new each, 3 tokens served per table when the process
    died 0.4 s in -> each table is submitted with an 8-token prompt for 5 new tokens; its next
    Token has step 3; the order's clock reads 0.4 s plus the time the restart took."""

    tokens: tuple[tuple[int, ...], ...]  # per table: the token ids already served
    finished: tuple[str, ...]  # per table: why it ended ("stop", "length"), "" while it cooks
    steps: tuple[StepRecord, ...]  # the order's trace so far: its wok's record, then its pot's passes
    elapsed_s: float  # the order's clock when the fresh process takes it
    wok_started: bool = False  # the host has had the order's PrefillStart (not told twice)
    restarts: int = 1  # engine processes this order has outlived


class RequestGroup:
    """B prompts submitted to `engine` as B requests; `take(step_events)` returns the order's events.

    The order is checked here (`shared_check`) unless `checked` says its caller already did (the
    host's loop places orders its check answered; `Engine.stream` checks with `Engine.check`);
    each table's `submit` checks its own request either way, as every request entering the engine
    is. `path`: which kitchen cooked it, for `GenerationResult.path`. `kv_allocated`: the KV bytes
    reserved for the order (default: each table's prompt + new tokens). `recorded`: the settings
    the result records (default: those given). `resume`: go on with an order a previous engine
    process was cooking (`OrderResume`)."""

    def __init__(self, engine, prompts: list, max_new_tokens: int, order_id: int = 0, *,
                 path: str = "class kitchen", kv_allocated: int | None = None, recorded: dict | None = None,
                 checked: bool = False, resume: OrderResume | None = None, **settings):  # fmt: skip
        if not checked:
            shared_check(engine, prompts, max_new_tokens, **settings)
        self.engine, self.order_id, self.max_new, self.path = engine, order_id, max_new_tokens, path
        self.settings = recorded if recorded is not None else {"max_new_tokens": max_new_tokens} | settings
        self.kv_allocated = kv_allocated
        self.prompts = [list(p) for p in encode_prompts(prompts, engine.codec)]
        n = len(self.prompts)
        if resume is not None and not len(resume.tokens) == len(resume.finished) == n:
            raise EngineError(f"a resumed order of {n} tables came with {len(resume.tokens)} tables' tokens")
        kept = [list(t) for t in resume.tokens] if resume is not None else [[] for _ in range(n)]
        ended = list(resume.finished) if resume is not None else [""] * n
        arrival = time.perf_counter()  # each table's own clock (its TTFT in the engine's metrics) starts here
        self.t0 = arrival - (resume.elapsed_s if resume is not None else 0.0) - engine.clock_start  # the order's zero
        seed = int(settings.pop("seed", 0))
        self.kept = kept  # per table: tokens a previous engine process served
        self.table: dict[int, int] = {}  # engine request id -> table
        try:
            for table, prompt in enumerate(self.prompts):
                if not ended[table]:
                    rid = engine.submit(prompt + kept[table], max_new_tokens - len(kept[table]), arrival_s=arrival,
                                        seed=seed + table, **settings)  # fmt: skip
                    self.table[rid] = table
        except Exception:
            for rid in self.table:  # a refused table: the whole order leaves the kitchen
                engine.cancel(rid)
            raise
        self.rids = list(self.table)
        # The tables' sequences, held past their Done: a table that finishes in a pass still held its K/V in it.
        self.seqs = [None] * n
        for rid, table in self.table.items():
            self.seqs[table] = seq = engine.serving.seqs[rid]
            if kept[table] and not seq.params.greedy:
                skip_draws(seq.generator, len(kept[table]), engine.cfg.vocab_size)
        self.cached = [0] * n  # K/V positions each table holds
        self.wok: list[StepRecord] = []  # the passes of the order's prefill, folded into one
        self.passes: list[WokPass] = []  # the same passes as the page draws them (this order's share of each)
        self.trace = Trace()
        self.finished: dict[int, str] = {t: why for t, why in enumerate(ended) if why}  # table -> finish reason
        self.started = False
        self.waiting_first = {t for t in range(n) if not kept[t] and not ended[t]}  # tables still in the wok
        if resume is not None:
            self.trace.steps, self.started = list(resume.steps), resume.wok_started
            if (wok := self.trace.prefill) is not None:  # the wok was done: every table had its first bowl
                self.trace.t_first_token, self.waiting_first = wok.t_end, set()
            served = sum(map(len, kept))
            self.trace.notes.append(
                f"the engine process was restarted {resume.restarts} time{'s' if resume.restarts > 1 else ''} "
                f"while this order cooked; it went on from the {served:,} tokens already served, the fresh "
                "process recomputing their KV cache in its first pass")  # fmt: skip

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.prompts)

    @property
    def cancelled(self) -> bool:
        return "cancelled" in self.finished.values()

    def cancel(self) -> None:
        for rid, table in self.table.items():
            if table not in self.finished:
                self.engine.cancel(rid)

    def follow(self) -> Iterator[Event]:
        """Step the engine until the order is done, yielding its events: for an engine that only
        this order uses (`Engine.stream`). The order's clock pauses while the consumer holds an
        event (a page drawing is not TTFT): its zero moves later by the time held."""
        step = self.engine.step
        while not self.done:
            for ev in self.take(step()):
                held = time.perf_counter()
                yield ev
                self.t0 += time.perf_counter() - held

    def take(self, events: list[Event]) -> list[Event]:
        """This order's events among one step's, on the order's clock (seconds since it arrived).
        One pass over the step's events: it runs once per decode step of every order."""
        table, t0, oid = self.table, self.t0, self.order_id
        step, tokens, ended = None, [], []
        for ev in events:
            kind = type(ev)
            if kind is Token:
                t = table.get(ev.request_id)
                if t is not None:
                    tokens.append(Token(ev.t - t0, t, ev.step + len(self.kept[t]), ev.token_id, ev.text, ev.finished, oid))
            elif kind is StepEnd:
                step = ev
            elif kind is Done and ev.request_id in table:
                ended.append(ev)
        mine = step is not None and not table.keys().isdisjoint(step.request_ids)
        out: list[Event] = []
        if not mine:
            out += tokens
        elif self.waiting_first:  # this pass belongs to the order's prefill
            if not self.started:
                self.started = True
                lengths = [len(p) for p in self.prompts]
                # slots: the positions the wok computes, so a reused prefix is not counted as cooked
                out.append(PrefillStart(step.step.t_start - t0, len(lengths), lengths, sum(lengths) - self.reused,
                                        "packed", oid))  # fmt: skip
            before = len(self.waiting_first)
            self.waiting_first.difference_update(self.table[e.request_id] for e in events
                                                 if type(e) is Token and e.request_id in table)  # fmt: skip
            self.wok.append(self._rebased(step, step.step.phase, step.step.index))
            rec, cooked = self.wok[-1], self._cooked()
            self.passes.append(WokPass(rec.t_end, len(self.wok), rec.t_start, cooked - sum(p.tokens for p in self.passes),
                                       rec.tokens, before - len(self.waiting_first), oid))  # fmt: skip
            if self.waiting_first:  # more of the order's prompts still to compute
                out += [self.passes[-1], *tokens]
            else:  # every table has its first bowl: the wok is done
                rec = self._wok_record()
                passes = tuple(self.passes) if len(self.passes) > 1 else ()
                out += [PrefillEnd(rec.t_end, rec, rec.kv_bytes, oid, passes), *tokens, StepEnd(rec.t_end, rec, oid)]
        else:
            rec = self._rebased(step, "decode", len(self.trace.steps))
            self.trace.steps.append(rec)
            tokens.append(StepEnd(rec.t_end, rec, oid))
            out = tokens
        for ev in ended:
            t = table[ev.request_id]
            self.finished[t] = ev.result.finish_reason
            self.cached[t] = 0  # its seat is free
        if ended and self.done and not self.cancelled:
            out.append(Done(out[-1].t if out else 0.0, self._result(), oid))
        return out

    def _cooked(self) -> int:
        """Prompt tokens the wok has computed for this order so far (not those taken from leftovers)."""
        return sum(max(0, min(s.num_cached, len(s.prompt)) - s.cached_tokens) for s in self.seqs if s is not None)

    @property
    def reused(self) -> int:
        """Prompt tokens the order's tables took from a cached prefix (known once they are seated)."""
        return sum(seq.cached_tokens for seq in self.seqs if seq is not None)

    def _rebased(self, end: StepEnd, phase: str, index: int) -> StepRecord:
        """A pass's record on the order's clock, its `kv_bytes` the order's tables' own (a table that
        finished in this very pass still held its K/V in it), and `others` the sequences in it that
        are not this order's (the class's, in a shared kitchen)."""
        rec, finished, cached = end.step, self.finished, self.cached
        for t, seq in enumerate(self.seqs):
            if t not in finished and seq is not None:
                cached[t] = seq.num_cached
        t0 = self.t0
        return StepRecord(phase, index, rec.t_start - t0, rec.t_end - t0, rec.forward_s, rec.batch, rec.tokens,
                          rec.slots, rec.kv_tokens, sum(cached) * self.engine.info.kv_bytes_per_token, rec.flops,
                          rec.bytes_moved, sum(rid not in self.table for rid in end.request_ids))  # fmt: skip

    def _wok_record(self) -> StepRecord:
        """The order's prefill passes as one record (one pass in the usual case)."""
        w = self.wok
        rec = StepRecord(
            phase="prefill", index=0, t_start=w[0].t_start, t_end=w[-1].t_end,
            forward_s=sum(r.forward_s for r in w), batch=max(r.batch for r in w), tokens=sum(r.tokens for r in w),
            slots=sum(r.slots for r in w), kv_tokens=sum(r.kv_tokens for r in w), kv_bytes=w[-1].kv_bytes,
            flops=sum(r.flops for r in w), bytes_moved=sum(r.bytes_moved for r in w), others=max(r.others for r in w),
        )  # fmt: skip
        if len(w) > 1:
            self.trace.notes.append(
                f"the wok's work for this order took {len(w)} passes of the shared kitchen (its prompts were "
                "larger than one pass's token budget, or tables waited for a seat); its time spans them all"
            )
        self.trace.steps.append(rec)
        self.trace.t_first_token = rec.t_end
        return rec

    @property
    def tokens(self) -> list[list[int]]:
        """Each table's tokens so far (those a previous process served, then its sequence's output)."""
        return [kept + (seq.output if seq is not None else []) for kept, seq in zip(self.kept, self.seqs, strict=True)]

    def _result(self) -> GenerationResult:
        self.trace.t_done = self.trace.steps[-1].t_end
        self.trace.notes += self._eager_notes()
        engine, info = self.engine, self.engine.info
        reserved = self.kv_allocated
        if reserved is None:
            reserved = sum(len(p) + self.max_new for p in self.prompts) * info.kv_bytes_per_token
        tokens = self.tokens
        return GenerationResult.of(
            tokens, self.prompts, self.trace, reserved, [engine.decode(t) if engine.codec is not None else "" for t in tokens],
            settings=dict(self.settings), model=info.name, device=str(engine.device), dtype=info.precision,
            request_id=self.order_id, path=self.path, reused_tokens=self.reused, table_ids=tuple(self.rids),
            reused_from=tuple(sorted({s.reused_from for s in self.seqs
                                      if s is not None and s.cached_tokens and s.reused_from >= 0})),
        )  # fmt: skip

    def _eager_notes(self) -> list[str]:
        """What decoded eagerly although asked otherwise: a failed CUDA graph capture, a failed compile."""
        graphs, compiled = self.engine.serving.runner.graphs, self.engine.compiled
        notes = [f"CUDA graph capture failed, decoded eagerly: {why}" for why in graphs.failed.values()] \
            if graphs is not None else []  # fmt: skip
        if compiled is not None and compiled.failure is not None:
            notes.append(f"compile=True, decoded eagerly: {compiled.failure}")
        return notes
