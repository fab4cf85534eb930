"""One order as one fixed batch: the lessons' other kitchens (`Engine.generate` / `Engine.stream`).

The order's prompts are prefilled together in one pass (padded or packed), then decoded together
until the last one finishes, with every knob the lessons turn -- cache modes (`static` /
`growing` / `none`), padded vs packed batching, the recorded single-batch CUDA graph -- and one
`Trace` of the order's own passes. Orders the serving core cooks exactly as asked run there
instead (engine/order_run.py); both share engine/order.py (the order, its clock, its result).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.batching import build_batch
from engine.cache import GrowingKVCache, KVCache, StaticKVCache
from engine.cuda_graph import GraphedDecode
from engine.events import Done, Event, PrefillEnd, PrefillStart, StepEnd, Token
from engine.limits import RequestSettings
from engine.model import decode_one_token, prefill
from engine.order import Clock, OrderRun
from engine.sampling import SamplingParams, sample
from engine.text import IncrementalDecoder
from engine.trace import StepRecord, Trace, measured_step


@dataclass(frozen=True)
class StepWork:
    """What one pass computed, for its StepRecord (see engine/trace.py for the field meanings)."""

    tokens: int
    slots: int
    kv_tokens: int
    attn_pairs: int | None = None


@dataclass
class Running:
    """Decode-phase state of the sequences still cooking (rows shrink as sequences finish)."""

    rows: list[int]  # index of each running row in the request's batch
    last: torch.Tensor  # (B, 1) token each row feeds next
    positions: torch.Tensor  # (B, 1) its position
    valid: torch.Tensor  # (B, S) cache slots holding real keys

    def keep(self, keep: list[int], cache: KVCache | None) -> None:
        """Compaction: drop finished rows so later steps stop paying for them."""
        idx = torch.tensor(keep, device=self.last.device)
        self.rows = [self.rows[i] for i in keep]
        self.last, self.positions, self.valid = self.last[idx], self.positions[idx], self.valid[idx]
        if cache is not None:
            cache.keep_rows(keep)


class FixedBatchRun(OrderRun):
    """Runs one order as one fixed batch; iterate `events()` once."""

    path = "fixed batch"

    def _new_cache(self, req: RequestSettings, batch: int, max_slots: int) -> KVCache | None:
        cfg, dtype = self.cfg, self.model.dtype
        if req.cache == "static":
            return StaticKVCache(
                cfg.n_layers, batch, cfg.n_kv_heads, cfg.head_dim, max_slots, dtype, self.device
            )
        if req.cache == "growing":
            return GrowingKVCache(cfg.n_layers, batch, cfg.n_kv_heads, cfg.head_dim, dtype, self.device)
        return None  # "none": every step recomputes the whole sequence

    def _record(self, phase, index, t_start, t_end, forward_s, batch, tokens, slots, kv_tokens, kv_bytes,
                logits_rows, attn_pairs=None) -> StepRecord:  # fmt: skip
        return measured_step(
            self.cfg, self.model.dtype.itemsize, phase=phase, index=index, t_start=t_start, t_end=t_end,
            forward_s=forward_s, batch=batch, tokens=tokens, slots=slots, kv_tokens=kv_tokens,
            kv_bytes=kv_bytes, logits_rows=logits_rows, attn_pairs=attn_pairs, quant=self.info.quant,
        )  # fmt: skip

    @torch.inference_mode()
    def _run(self) -> Iterator[Event]:
        prompts, req = self.prompts, self.req
        clock = Clock(self.device)
        params = SamplingParams(req.temperature, req.top_k, req.top_p)
        gen = torch.Generator(device=self.device).manual_seed(req.seed)
        B, lengths = len(prompts), [len(p) for p in prompts]
        max_slots = max(lengths) + req.max_new_tokens - 1  # the last token is never fed back
        batch = build_batch(prompts, req.batching, self.device, max_slots)
        cache = self._new_cache(req, B, max_slots)
        kv_allocated = cache.bytes_allocated if cache is not None else 0
        out: list[list[int]] = [[] for _ in prompts]
        decoders = [IncrementalDecoder(self.codec, p) for p in prompts]
        trace = Trace()
        yield from clock.emit([PrefillStart(clock.now(), B, lengths, batch.computed, req.batching, request_id=self.request_id)])

        # The wok: one pass over every prompt token.
        t_start = clock.now()
        logits = prefill(self.model, batch, cache)
        t_fwd = clock.now()
        first = sample(logits, params, gen)  # (B,)
        first_ids = first.tolist()
        trace.t_first_token = clock.now()
        if cache is not None:
            cache.add_live(lengths)
        kv_bytes = cache.bytes_in_use if cache is not None else 0
        rec = self._record("prefill", 0, t_start, t_fwd, t_fwd - t_start, B, sum(lengths), batch.computed,
                           sum(lengths), kv_bytes, B, batch.attn_pairs)  # fmt: skip
        trace.steps.append(rec)
        events: list[Event] = [PrefillEnd(t_fwd, rec, rec.kv_bytes, request_id=self.request_id)]
        done = [False] * B
        self._accept(first_ids, list(range(B)), out, decoders, req, 0, trace.t_first_token, events, done)
        events.append(StepEnd(trace.t_first_token, rec, request_id=self.request_id))
        yield from clock.emit(events)

        # The soup pot: one token per running sequence per step, until all are done.
        run = Running(list(range(B)), first[:, None], torch.tensor(lengths, device=self.device)[:, None],
                      batch.valid)  # fmt: skip
        graphed: GraphedDecode | None = None
        step = 0
        while True:
            live = [i for i, row in enumerate(run.rows) if not done[row]]
            if not live:
                break
            if len(live) < len(run.rows) and not req.cuda_graph:  # a graph's batch shape is fixed
                run.keep(live, cache)
                live = list(range(len(run.rows)))
            step += 1
            t_start = clock.now()
            if cache is None:  # recompute mode: the whole sequence again, through the prefill path
                full = build_batch([prompts[r] + out[r] for r in run.rows], req.batching, self.device)
                logits = prefill(self.model, full, None)
                work = StepWork(sum(full.lengths), full.computed, 0, full.attn_pairs)
            else:
                slot = batch.slots_used + step - 1  # one common cache slot per step for all rows
                if req.cuda_graph and graphed is None:  # step 1 includes recording the graph
                    run.valid[:, slot] = True
                    graphed = GraphedDecode(self.model, cache, run.valid, slot)
                    if graphed.failure:  # this request decodes eagerly; the next one records afresh
                        trace.notes.append(f"CUDA graph capture failed, decoded eagerly: {graphed.failure}")
                logits, read = self._decode_step(run, slot, cache, graphed)
                work = StepWork(len(live), len(run.rows), len(run.rows) * read)
            t_fwd = clock.now()
            nxt = sample(logits, params, gen)  # (B,)
            nxt_ids = nxt.tolist()
            t_end = clock.now()
            rows = [run.rows[i] for i in live]
            kv_bytes = 0
            if cache is not None:  # each live row fed one real token; a graph's finished rows feed junk
                cache.add_live([int(not done[r]) for r in run.rows])
                kv_bytes = cache.bytes_in_use
            rec = self._record("decode", step, t_start, t_end, t_fwd - t_start, len(run.rows), work.tokens,
                               work.slots, work.kv_tokens, kv_bytes, len(run.rows), work.attn_pairs)  # fmt: skip
            trace.steps.append(rec)
            events = []
            self._accept([nxt_ids[i] for i in live], rows, out, decoders, req, step, t_end, events, done)
            events.append(StepEnd(t_end, rec, request_id=self.request_id))
            run.last, run.positions = nxt[:, None], run.positions + 1
            yield from clock.emit(events)

        trace.t_done = trace.steps[-1].t_end if len(trace.steps) > 1 else trace.t_first_token
        if isinstance(cache, GrowingKVCache):
            kv_allocated = cache.peak_bytes
        result = self._result(out, trace, kv_allocated)
        yield from clock.emit([Done(clock.now(), result, request_id=self.request_id)])

    def _decode_step(self, run: Running, slot: int, cache: KVCache, graphed: GraphedDecode | None):
        """One soup-pot step at cache `slot`: -> (logits (B, V), cache slots each row read)."""
        run.valid[:, slot] = True  # the token fed now becomes a key every row may attend to
        if graphed is not None:
            return graphed(run.last, run.positions, slot), run.valid.shape[1]  # reads the whole allocation
        mask = run.valid[:, None, None, : slot + 1]  # (B, 1, 1, S): only the filled prefix
        input_pos = torch.tensor([slot], device=self.device)  # (1,)
        return decode_one_token(self.model, run.last, run.positions, input_pos, mask, cache), slot + 1

    def _accept(self, ids, rows, out, decoders, req, step, t, events, done) -> None:
        """Append one sampled token per live row, queue its Token event, mark finished rows in `done`."""
        for tok, row in zip(ids, rows, strict=True):
            out[row].append(tok)
            done[row] = len(out[row]) >= req.max_new_tokens or (req.stop_at_eos and tok in self.cfg.eos_ids)
            text = decoders[row].feed(tok, final=done[row])
            events.append(Token(t, row, step, tok, text, done[row], request_id=self.request_id))
