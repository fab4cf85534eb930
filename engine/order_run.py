"""One order on the serving core: the Kitchen's and the lab's orders, cooked over KV seats.

An order is B prompts cooked together (the Kitchen's tables). Here its prompts become B
`Sequence`s on a private static scheduler (engine/scheduler.py) over a `SeatPool` sized for the
order, and every pass goes through the serving `Runner`: the wok's pass prefills all B prompts at
once, then each soup-pot step decodes the sequences still running, and a finished one leaves its
seat at once. This is the core the class server runs (engine/engine.py `step()`), seen from
inside one order, so what the Kitchen measures is what the server does.

What stays the order's, so `generate()` / `stream()` keep their results:
  * one sampling generator for the order, drawn over the running tables in table order each step;
  * events and the `Trace` of the order's own passes: PrefillStart, PrefillEnd, Token per table,
    StepEnd per pass, Done with a `GenerationResult`;
  * a clock that pauses while the consumer handles an event (a page drawing is not TTFT).

Every order the engine cooks runs here: prompts of any lengths (the seats never pad: a pass lays
them out flat), and `cuda_graph=True` replays the runner's decode graphs of engine/cuda_graph.py
(a failed capture is one line in the trace's notes; that step runs eagerly). The lessons' other
kitchens -- a growing cache, no cache, a padded batch of mixed lengths -- are the lab's
(lab/kitchens.py), built on the same forward.

Worked example: 2 tables, prompts of 5 tokens, 3 new tokens each. Seats of 5 + 3 - 1 = 7 slots
(the last token is never fed back). Pass 1 (prefill): 10 tokens, 2 first tokens. Passes 2 and 3
(decode): 2 tokens each. 3 passes, 6 tokens out.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.compiled import CompiledDecode
from engine.cuda_graph import buckets
from engine.events import Done, Event, PrefillEnd, PrefillStart, StepEnd, Token
from engine.kv_pool import SeatPool
from engine.limits import RequestSettings
from engine.loader import ModelInfo
from engine.model import Transformer
from engine.order import Clock, OrderRun
from engine.runner import Runner
from engine.sampling import SamplingParams, sample
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.text import IncrementalDecoder, TextCodec
from engine.trace import Trace, measured_step


class SeatOrderRun(OrderRun):
    """Runs one order over its own seats; iterate `events()` once."""

    path = "seats"

    def __init__(self, model: Transformer, codec: TextCodec | None, info: ModelInfo, prompts: list[list[int]],
                 req: RequestSettings, request_id: int, compiled: CompiledDecode | None = None):  # fmt: skip
        """`compiled`: the engine's compiled decode step (engine/compiled.py), shared by its orders."""
        super().__init__(model, codec, info, prompts, req, request_id)
        self.compiled = compiled

    def _kitchen(self) -> tuple[SeatPool, Scheduler, list[Sequence]]:
        """Seats, a static scheduler holding the whole order, and one sequence per table (id = table)."""
        req, prompts = self.req, self.prompts
        seat_len = max(map(len, prompts)) + req.max_new_tokens - 1  # the last token is never fed back
        # cuda_graph: as many seats as the graph bucket that holds the whole order, for its padding rows
        seats = buckets(len(prompts))[-1] if req.cuda_graph else len(prompts)
        pool = SeatPool(self.cfg, seats, seat_len, self.model.dtype, self.device)
        # The whole order is admitted in one pass: its memory, prefill working memory included,
        # was checked before the run (engine/limits.py), so the scheduler needs no second budget.
        config = SchedulerConfig("static", len(prompts), max(1, sum(map(len, prompts))),
                                 kv_tokens=sum(len(p) + req.max_new_tokens for p in prompts))  # fmt: skip
        sched = Scheduler(config, pool, lambda tokens, longest: 0, 0)
        stop = frozenset(self.cfg.eos_ids) if req.stop_at_eos else frozenset()
        unused = torch.Generator(device=self.device)  # the order samples with its own one generator
        seqs = [
            Sequence(table, p, req.max_new_tokens, SamplingParams(req.temperature, req.top_k, req.top_p), unused,
                     stop, IncrementalDecoder(self.codec, p))  # fmt: skip
            for table, p in enumerate(prompts)
        ]
        for seq in seqs:
            sched.add(seq)
        return pool, sched, seqs

    def _run(self) -> Iterator[Event]:
        """Inference mode is entered around each pass, not across the generator: a decorated
        generator re-enters it at every resume, once per event (a table's token), ~3 us each."""
        req, prompts, rid = self.req, self.prompts, self.request_id
        clock = Clock(self.device)
        params = SamplingParams(req.temperature, req.top_k, req.top_p)
        gen = torch.Generator(device=self.device).manual_seed(req.seed)
        lengths = [len(p) for p in prompts]
        pool, sched, seqs = self._kitchen()
        runner = Runner(self.model, pool, cuda_graphs=req.cuda_graph, compiled=self.compiled)
        trace = Trace()
        yield from clock.emit([PrefillStart(clock.now(), len(prompts), lengths, sum(lengths), req.batching, rid)])

        step = 0
        while not sched.idle:
            plan = sched.schedule(clock.now(sync=False))
            t_start = clock.now()
            with torch.inference_mode():
                out = runner.run(plan)
                t_fwd = clock.now()
                kv_bytes = pool.bytes_in_use  # before finished tables leave their seats
                tables = [w.seq.request_id for w in out.sampled]
                order = sorted(range(len(tables)), key=tables.__getitem__)  # logits rows in table order
                logits = out.logits if order == list(range(len(order))) else out.logits[order]
                picks = sample(logits, params, gen).tolist()  # (B,) one draw for the running tables
            t_end = clock.now()
            if step == 0:
                trace.t_first_token = t_end
            events: list[Event] = []
            for i, tok in zip(order, picks, strict=True):
                seq = seqs[tables[i]]
                done = seq.append(tok, t_end)
                events.append(Token(t_end, seq.request_id, step, tok, seq.decoder.feed(tok, final=done), done, rid))
                if done:
                    sched.remove(seq)
            rec = measured_step(
                self.cfg, self.model.dtype.itemsize, phase=plan.phase, index=step, t_start=t_start, t_end=t_end,
                forward_s=t_fwd - t_start, batch=len(plan.work), tokens=out.tokens, slots=out.tokens,
                kv_tokens=out.kv_read if step else out.tokens, kv_bytes=kv_bytes,
                logits_rows=out.logits.shape[0], attn_pairs=out.attn_pairs, quant=self.info.quant,
            )  # fmt: skip
            trace.steps.append(rec)
            if step == 0:
                events.insert(0, PrefillEnd(t_fwd, rec, rec.kv_bytes, rid))
            events.append(StepEnd(t_end, rec, rid))
            step += 1
            yield from clock.emit(events)

        trace.t_done = trace.steps[-1].t_end
        if runner.graphs is not None:
            trace.notes += [f"CUDA graph capture failed, decoded eagerly: {why}" for why in runner.graphs.failed.values()]
        if self.compiled is not None and self.compiled.failure is not None:
            trace.notes.append(f"compile=True, decoded eagerly: {self.compiled.failure}")
        result = self._result([s.output for s in seqs], trace, pool.bytes_reserved)
        yield from clock.emit([Done(clock.now(), result, request_id=rid)])
