"""The lessons' other kitchens: a growing cache, no cache, and a padded batch of mixed lengths.

The engine cooks every order over its KV seats (`Engine.stream`, engine/request_group.py). The lab's
lessons also show what that design saves, so they need kitchens the engine does not run:

  cache="growing"   K/V start empty and are torch.cat'ed onto each step: every step copies the
                    whole cache (quadratic traffic the kv-cache lesson shows)
  cache="none"      nothing is kept: every decode step re-feeds the whole sequence
  batching="padded" prompts of mixed lengths left-padded to the longest (the padding lesson's
                    waste is real work here); the seats never pad

These run the engine's one forward (`Transformer.forward`) with a KV view of their own -- the
growing store below (`GrowingPass`), the seats of a `SeatPool` as one fixed batch (`BatchKV`), or
none -- and hand back the engine's own events and `GenerationResult` (path "fixed batch"), so the
lab reads one result type. `stream()` sends an order the seats cook as asked to the engine.
They sample by the engine's rule: table i with its own generator seeded `seed + i`, so every
kitchen gives the same tokens at any temperature.

Worked example, the padded kitchen: prompts of 3 and 5 tokens, 2 new tokens. The wok computes a
(2, 5) block (10 slots, 2 of them padding); each decode step writes one common slot (5, then 6)
for both rows and attends through the `valid` mask.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from engine.attention import additive_bias, causal, decode_attention, packed_attention
from engine.batching import PrefillBatch, build_batch
from engine.errors import EngineError
from engine.events import Done, Event, PrefillEnd, PrefillStart, StepEnd, Token
from engine.kv_pool import SeatPool
from engine.limits import RequestSettings
from engine.loader import ModelInfo
from engine.model import Transformer, decode_one_token, prefill
from engine.results import GenerationResult
from engine.sampling import SamplingParams, sample
from engine.text import IncrementalDecoder, TextCodec
from engine.trace import Trace, measured_step

CACHE_MODES = ("static", "growing", "none")  # the lessons' knobs: the engine itself only runs static and packed
BATCHING_MODES = ("padded", "packed")


def on_seats(cache: str, batching: str, prompts: list[list[int]]) -> bool:
    """Whether the engine's seats cook this order exactly as asked (they never pad)."""
    return cache == "static" and (batching == "packed" or len({len(p) for p in prompts}) == 1)


def stream(engine, prompts, max_new_tokens: int = 64, cache: str = "static", batching: str = "packed",
           **settings) -> Iterator[Event]:  # fmt: skip
    """`engine.stream()` with the lessons' knobs, `cache` and `batching`: the seats where they cook
    it, else a kitchen here. A knob's bad value is refused in one line, as the engine refuses its own."""
    if cache not in CACHE_MODES:
        raise EngineError(f"unknown cache mode '{cache}' (choose {', '.join(CACHE_MODES)})")
    if batching not in BATCHING_MODES:
        raise EngineError(f"unknown batching '{batching}' (choose {', '.join(BATCHING_MODES)})")
    graph_line = "cuda_graph=True replays the seats' decode graphs: use cache='static' and batching='packed'"
    if settings.get("cuda_graph") and cache != "static":
        raise EngineError(graph_line)
    ids = engine.check(prompts, max_new_tokens, **settings)  # the engine's one-line refusals of sizes and settings
    if on_seats(cache, batching, ids):
        return engine.stream(ids, max_new_tokens, **settings)
    req = RequestSettings(max_new_tokens=max_new_tokens, **settings)
    if req.cuda_graph:
        raise EngineError(graph_line)
    return FixedBatch(engine.model, engine.codec, engine.info, ids, req, 0, cache, batching).events()


def generate(engine, prompts, max_new_tokens: int = 64, **settings):
    """`engine.generate()` with the lessons' knobs (see `stream`)."""
    for ev in stream(engine, prompts, max_new_tokens, **settings):
        if isinstance(ev, Done):
            return ev.result
    raise AssertionError("stream ended without Done")


class GrowingKV:
    """K/V per layer that start empty and grow by one column per decode step (torch.cat)."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.peak_bytes = 0

    @property
    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """k, v (B, Hkv, T, D) onto the end of the layer's (B, Hkv, S, D) -> (B, Hkv, S + T, D)."""
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k.contiguous(), v.contiguous()
        else:  # every step copies the whole cache: the traffic this kitchen exists to show
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)  # (B, Hkv, S+T, D)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        self.peak_bytes = max(self.peak_bytes, self.bytes_allocated)
        return self.k[layer], self.v[layer]

    def write_packed(self, layer: int, lengths: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Packed K/V (1, Hkv, N, D) into rows (B, Hkv, Lmax, D), sequence b at slots 0..len-1."""
        _, hkv, _, d = k.shape
        self.k[layer] = k.new_zeros(len(lengths), hkv, max(lengths), d)  # (B, Hkv, Lmax, D)
        self.v[layer] = v.new_zeros(len(lengths), hkv, max(lengths), d)
        start = 0
        for row, n in enumerate(lengths):
            self.k[layer][row, :, :n] = k[0, :, start : start + n]
            self.v[layer][row, :, :n] = v[0, :, start : start + n]
            start += n
        self.peak_bytes = max(self.peak_bytes, self.bytes_allocated)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.k = [t.index_select(0, rows) for t in self.k]  # type: ignore[union-attr]
        self.v = [t.index_select(0, rows) for t in self.v]  # type: ignore[union-attr]


@dataclass(frozen=True)
class GrowingPass:
    """One pass over a GrowingKV (a KVView): `mask` (B, 1, T, S) bool for a padded prefill, the
    additive bias (B, 1, 1, S) for a decode step, or None; `packed` lengths for a packed prefill."""

    store: GrowingKV
    mask: torch.Tensor | None = None
    packed: list[int] | None = None

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        B, H, T, D = q.shape
        if self.packed is not None:
            self.store.write_packed(layer, self.packed, k, v)
            return packed_attention(q, k, v, self.packed).transpose(1, 2).reshape(B, T, H * D)  # (1, N, H*D)
        keys, values = self.store.append(layer, k, v)  # (B, Hkv, S, D)
        if T == 1 and self.mask is not None:
            return decode_attention(q, keys, values, self.mask)  # (B, 1, H*D)
        return causal(q, keys, values, self.mask).transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)


def keep_seats(pool: SeatPool, rows: torch.Tensor) -> None:
    """Compaction of a fixed batch in seats 0..B-1: rows `rows` into seats 0..len-1, in order."""
    n = rows.numel()
    for seats in (*pool.k_layer, *pool.v_layer):  # each layer's seats are a tensor of their own
        seats[:n] = seats.index_select(0, rows)  # (n, Hkv, T, D): a copy, then written back


class Clock:
    """Seconds since the order started, minus the time the consumer held an event (a page drawing
    is not TTFT). On CUDA each reading waits for the queued kernels."""

    def __init__(self, device: torch.device):
        self.device, self.t0, self.paused_s = device, time.perf_counter(), 0.0

    def now(self, sync: bool = True) -> float:
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0 - self.paused_s

    def emit(self, events: list[Event]) -> Iterator[Event]:
        for ev in events:
            held = time.perf_counter()
            yield ev
            self.paused_s += time.perf_counter() - held


class FixedBatch:
    """One order as one fixed batch: the wok over every prompt, then decode steps until the last
    finishes, finished rows dropped (compaction). Iterate `events()` once."""

    path = "fixed batch"

    def __init__(self, model: Transformer, codec: TextCodec | None, info: ModelInfo, prompts: list[list[int]],
                 req: RequestSettings, request_id: int, cache: str = "static", batching: str = "packed"):  # fmt: skip
        self.model, self.codec, self.info = model, codec, info
        self.cfg, self.device = model.cfg, model.device
        self.prompts, self.req, self.request_id = prompts, req, request_id
        self.cache, self.batching = cache, batching

    def events(self) -> Iterator[Event]:
        with torch.inference_mode():
            yield from self._cook()

    def _sample(self, logits: torch.Tensor, rows: list[int], params: SamplingParams, gens) -> torch.Tensor:
        """(B, V) -> (B,): row j is table rows[j], sampled with that table's own generator."""
        if params.greedy:
            return sample(logits, params, None)
        return torch.cat([sample(logits[j : j + 1], params, gens[r]) for j, r in enumerate(rows)])

    def _prefill(self, batch: PrefillBatch, store) -> torch.Tensor:
        if isinstance(store, GrowingKV):
            kv = GrowingPass(store, batch.mask, batch.packed)
            return self.model(batch.tokens, batch.positions, kv, batch.logits_rows)
        return prefill(self.model, batch, store)  # a SeatPool, or None (recompute)

    def _decode(self, store, last, positions, valid, slot: int) -> torch.Tensor:
        """One token per row at common slot `slot`, reading the slots `valid` (B, S) marks. -> (B, V)"""
        mask = valid[:, None, None, : slot + 1]  # (B, 1, 1, S): only the filled prefix
        if isinstance(store, GrowingKV):
            kv = GrowingPass(store, additive_bias(mask, self.model.dtype))
            return self.model(last, positions, kv)[:, -1]
        return decode_one_token(self.model, last, positions, torch.tensor([slot], device=self.device), mask, store)

    def _cook(self) -> Iterator[Event]:
        prompts, req, cfg, rid = self.prompts, self.req, self.cfg, self.request_id
        clock = Clock(self.device)
        params = SamplingParams(req.temperature, req.top_k, req.top_p)
        B, lengths = len(prompts), [len(p) for p in prompts]
        gens = [torch.Generator(device=self.device).manual_seed(req.seed + i) for i in range(B)]  # table i: seed + i
        max_slots = max(lengths) + req.max_new_tokens - 1  # the last token is never fed back
        batch = build_batch(prompts, self.batching, self.device, max_slots)
        store = {"static": lambda: SeatPool(cfg, B, max_slots, self.model.dtype, self.device),
                 "growing": lambda: GrowingKV(cfg.n_layers)}.get(self.cache, lambda: None)()  # fmt: skip
        per_token = cfg.kv_bytes_per_token(self.model.dtype.itemsize)
        live = [0] * B  # real tokens each row keeps (padding and junk slots excluded)
        out: list[list[int]] = [[] for _ in prompts]
        decoders = [IncrementalDecoder(self.codec, p) for p in prompts]
        trace = Trace()
        yield from clock.emit([PrefillStart(clock.now(), B, lengths, batch.computed, self.batching, request_id=rid)])

        t_start = clock.now()  # the wok: one pass over every prompt token
        logits = self._prefill(batch, store)
        t_fwd = clock.now()
        first = self._sample(logits, list(range(B)), params, gens)  # (B,)
        trace.t_first_token = clock.now()
        if store is not None:
            live = list(lengths)
        rec = self._record("prefill", 0, t_start, t_fwd, B, sum(lengths), batch.computed, sum(lengths),
                           sum(live) * per_token, B, batch.attn_pairs)  # fmt: skip
        trace.steps.append(rec)
        events: list[Event] = [PrefillEnd(t_fwd, rec, rec.kv_bytes, request_id=rid)]
        done = [False] * B
        self._accept(first.tolist(), list(range(B)), out, decoders, 0, trace.t_first_token, events, done)
        events.append(StepEnd(trace.t_first_token, rec, request_id=rid))
        yield from clock.emit(events)

        rows = list(range(B))  # the soup pot: one token per running row per step
        last, positions = first[:, None], torch.tensor(lengths, device=self.device)[:, None]  # (B, 1) each
        valid, step = batch.valid, 0  # (B, S) slots holding real keys
        while not all(done):
            keep = [i for i, r in enumerate(rows) if not done[r]]
            if len(keep) < len(rows):  # compaction: later steps stop paying for finished rows
                idx = torch.tensor(keep, device=self.device)
                rows, last, positions, valid = [rows[i] for i in keep], last[idx], positions[idx], valid[idx]
                live = [live[i] for i in keep]
                if isinstance(store, GrowingKV):
                    store.keep_rows(idx)
                elif store is not None:
                    keep_seats(store, idx)
            step += 1
            t_start = clock.now()
            if store is None:  # recompute: the whole sequence again, through the wok's pass
                full = build_batch([prompts[r] + out[r] for r in rows], self.batching, self.device)
                logits = prefill(self.model, full, None)
                work = (sum(full.lengths), full.computed, 0, full.attn_pairs)
            else:
                slot = batch.slots_used + step - 1  # one common cache slot per step for all rows
                valid[:, slot] = True  # the token fed now becomes a key every row may attend to
                logits = self._decode(store, last, positions, valid, slot)
                live = [n + 1 for n in live]
                work = (len(rows), len(rows), len(rows) * (slot + 1), None)
            t_fwd = clock.now()
            nxt = self._sample(logits, rows, params, gens)  # (B,)
            t_end = clock.now()
            rec = self._record("decode", step, t_start, t_end, len(rows), work[0], work[1], work[2],
                               sum(live) * per_token, len(rows), work[3], forward_s=t_fwd - t_start)  # fmt: skip
            trace.steps.append(rec)
            events = []
            self._accept(nxt.tolist(), rows, out, decoders, step, t_end, events, done)
            events.append(StepEnd(t_end, rec, request_id=rid))
            last, positions = nxt[:, None], positions + 1
            yield from clock.emit(events)

        trace.t_done = trace.steps[-1].t_end if len(trace.steps) > 1 else trace.t_first_token
        allocated = store.peak_bytes if isinstance(store, GrowingKV) else store.bytes_reserved if store else 0
        texts = [self.codec.decode(t) if self.codec is not None else "" for t in out]
        result = GenerationResult.of(
            out, prompts, trace, allocated, texts, settings=asdict(req) | {"cache": self.cache, "batching": self.batching}, model=self.info.name, device=str(self.device),
            dtype=self.info.precision, request_id=rid, path=self.path,
        )  # fmt: skip
        yield from clock.emit([Done(clock.now(), result, request_id=rid)])

    def _record(self, phase, index, t_start, t_end, batch, tokens, slots, kv_tokens, kv_bytes, logits_rows,
                attn_pairs=None, forward_s=None):  # fmt: skip
        return measured_step(
            self.cfg, self.model.dtype.itemsize, phase=phase, index=index, t_start=t_start, t_end=t_end,
            forward_s=t_end - t_start if forward_s is None else forward_s, batch=batch, tokens=tokens,
            slots=slots, kv_tokens=kv_tokens, kv_bytes=kv_bytes, logits_rows=logits_rows,
            attn_pairs=attn_pairs, quant=self.info.quant,
        )  # fmt: skip

    def _accept(self, ids, rows, out, decoders, step, t, events, done) -> None:
        """Append one sampled token per row, queue its Token event, mark finished rows in `done`."""
        req = self.req
        for tok, row in zip(ids, rows, strict=True):
            out[row].append(tok)
            done[row] = len(out[row]) >= req.max_new_tokens or (req.stop_at_eos and tok in self.cfg.eos_ids)
            text = decoders[row].feed(tok, final=done[row])
            events.append(Token(t, row, step, tok, text, done[row], request_id=self.request_id))
