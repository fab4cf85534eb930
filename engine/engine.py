"""The engine: one loaded model that cooks orders in two phases -- the wok, then the soup pot.

Two ways in (docs/engine-api.md has the contract):

  serving   `submit()` requests at any time, then call `step()` in a loop: each step is one
            scheduler iteration (engine/scheduler.py picks who cooks, engine/runner.py runs the one
            forward pass over the KV seats of engine/kv_pool.py) and returns its events. Requests
            join and leave the running batch at any step; `cancel()` frees a seat at the next one.
  an order  `generate()` / `stream()`: one order's prompts `submit()`ted as requests to an engine
            sized for that order alone, then `step()`ped until the last is done; a `RequestGroup`
            (engine/request_group.py) tells them as one order, as the Kitchen's class kitchen does.

    eng = Engine.load("chef", policy="chunked", token_budget=256)
    a = eng.submit("ROMEO:", max_new_tokens=16)
    b = eng.submit([1, 2, 3], max_new_tokens=8, temperature=0.8, seed=7)
    while not eng.idle:
        for ev in eng.step():
            ...  # Token(request_id=a, ...), StepEnd(request_ids=(a, b), ...), Done(request_id=b, ...)

Not thread-safe: one thread owns an Engine (the app's engine process, the class server's loop).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, replace

import torch

from engine import invariance
from engine.compiled import CompiledDecode
from engine.config import ModelConfig
from engine.cuda_graph import buckets
from engine.errors import EngineError
from engine.events import Done, Event, StepEnd, Token
from engine.limits import Limits, RequestSettings, available_memory, check_request, kv_limits
from engine.loader import ModelInfo, load_model
from engine.logprobs import row_extras, token_logprobs
from engine.model import Transformer
from engine.native import NativeStep
from engine.request_group import ORDER_SETTINGS, RequestGroup
from engine.results import GenerationResult, RequestOutput, request_metrics
from engine.runner import PassOutput
from engine.sampling import SamplingParams
from engine.sequence import Sequence, Status
from engine.serving_core import (
    DecodeStep,
    Serving,
    ServingLimits,
    ServingState,
    budget_limits,
    describe_decode_step,
    make_decode_step,
    order_limits,
)
from engine.settings import EngineSettings
from engine.speculative import pass_tokens
from engine.text import IncrementalDecoder, TextCodec, encode_prompts
from engine.trace import measured_step

ORDER_ONLY = ("cuda_graph", "native")  # settings of one order (generate/stream)


class Engine:
    """One loaded model on one device."""

    def __init__(self, model: Transformer, codec: TextCodec | None, info: ModelInfo,
                 settings: EngineSettings | None = None, decode_step: DecodeStep | None = None):  # fmt: skip
        """`decode_step`: the pass to share (another engine's over the same model)."""
        self.model, self.codec, self.info = model, codec, info
        self.cfg: ModelConfig = model.cfg
        self.device = model.device
        self.settings = settings or EngineSettings()
        self.settings.check()
        self._serving: Serving | None = None  # built at the first submit: generate() never pays for it
        # One decode step for the serving core and every order's engine (engine/native.py, engine/compiled.py)
        self.decode_step = decode_step if decode_step is not None else make_decode_step(model, self.settings)
        self.info = replace(info, decode_step=describe_decode_step(self.decode_step))
        self._next_id, self._steps = 0, 0
        self._itemsize = model.dtype.itemsize  # read once: every step's record needs it
        self._t0 = time.perf_counter()

    @classmethod
    def load(cls, model: str, settings: EngineSettings | None = None, **changes) -> Engine:
        """Folder, FILE.gguf, `preset:NAME`, an embedded (chef) or fetched (assistant) model's name or hub id -> an Engine.

        `settings` (engine/settings.py) says how it loads and serves; `changes` are single fields
        over them, for a one-line load: `Engine.load("chef", policy="chunked")`. Every value is
        checked before the weights are read, and a bad one is refused in one line.
        """
        s = (settings or EngineSettings()).but(**changes)
        s.check()
        if s.batch_invariant:
            invariance.require(s.device, s.dtype, s.quant, s.compile)
        loaded = load_model(model, s.device, s.dtype, s.quant)
        return cls(loaded.model, loaded.codec, loaded.info, s)

    @property
    def compiled(self) -> CompiledDecode | None:  # the torch.compile'd decode step, when compile=True
        return self.decode_step if isinstance(self.decode_step, CompiledDecode) else None

    @property
    def native(self) -> NativeStep | None:  # the native step, the CPU default; `problem` says why not
        return self.decode_step if isinstance(self.decode_step, NativeStep) else None

    @property
    def clock_start(self) -> float:
        """`time.perf_counter()` when the engine's clock started: event times are seconds since then."""
        return self._t0

    # --- text -------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self.codec is None:
            raise EngineError("this model has no tokenizer; give prompts as token-id lists")
        return self.codec.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids) if self.codec is not None else ""

    # --- validation -------------------------------------------------------------------------------
    def limits(self, prompt_len: int, max_new_tokens: int) -> Limits:
        """Largest batch the memory budget allows for this request shape, and the context limit."""
        budget = self.settings.kv_budget_bytes
        return kv_limits(self.cfg, self.model.dtype, self.device, budget, prompt_len, max_new_tokens)

    def check(self, prompts, max_new_tokens: int = 64, **settings) -> list[list[int]]:
        """Validate an order without running it; returns the prompts as token ids."""
        req = RequestSettings(max_new_tokens=max_new_tokens, **settings)
        ids = encode_prompts(prompts, self.codec)
        check_request(self.cfg, ids, req, self.limits(max(map(len, ids), default=1), max_new_tokens))
        if req.cuda_graph and self.device.type != "cuda":
            raise EngineError(f"cuda_graph=True needs a CUDA device; this engine runs on {self.device}")
        if req.speculate:
            raise EngineError("speculative decoding runs on the serving path: submit() each prompt with speculate=K")
        if req.logprobs >= 0 or req.min_tokens:
            raise EngineError("logprobs and min_tokens run on the serving path: submit() each prompt with them")
        return ids

    # --- one order: its tables submitted to an engine of its own, stepped until done --------------
    def generate(self, prompts, max_new_tokens: int = 64, **settings) -> GenerationResult:
        for ev in self.stream(prompts, max_new_tokens=max_new_tokens, **settings):
            if isinstance(ev, Done):
                return ev.result
        raise AssertionError("stream ended without Done")

    def stream(self, prompts, max_new_tokens: int = 64, **settings) -> Iterator[Event]:
        """`generate`'s events as they happen. An order's tables cook together in seats of their own,
        laid out flat (the seats never pad); the lessons' other kitchens (a growing cache, none, a
        padded batch) are the lab's (lab/kitchens.py)."""
        req = RequestSettings(max_new_tokens=max_new_tokens, **settings)
        return self._serve_order(self.check(prompts, max_new_tokens, **settings), req)

    def _serve_order(self, ids: list[list[int]], req: RequestSettings) -> Iterator[Event]:
        """A checked order, cooked at the first `next()`: an engine over this model sized for it
        (serving_core.py `order_limits`), its tables submitted, stepped until the last is done; what
        the class kitchen cooks for it. Tests call it to run cuda_graph=True's bookkeeping on a CPU."""
        lengths = [len(p) for p in ids]
        seats = buckets(len(ids))[-1] if req.cuda_graph else len(ids)  # a graph bucket's padding rows need seats
        budget = self.limits(max(lengths), req.max_new_tokens).kv_budget_bytes
        config = self.settings.but(policy="static", token_budget=max(1, sum(lengths)), max_seqs=seats, max_seq_len=None,
                                   kv_tokens=0, prefix_cache=False, kv_budget_bytes=budget)  # fmt: skip
        limits = order_limits(self.model, lengths, req.max_new_tokens, seats)
        # native=False: this order runs the torch forward op by op (the portioning station, lab/overhead.py)
        step = None if not req.native and isinstance(self.decode_step, NativeStep) else self.decode_step
        kitchen = Engine(self.model, self.codec, self.info, config.but(native=False), step)
        kitchen._serving = Serving(self.model, config, limits, step, req.cuda_graph)
        sampling = {k: v for k, v in asdict(req).items() if k in ORDER_SETTINGS and k != "reuse_prefix"}
        group = RequestGroup(kitchen, ids, req.max_new_tokens, self._new_id(), path="seats",
                             kv_allocated=limits.pool_bytes, recorded=asdict(req), checked=True, **sampling)  # fmt: skip
        yield from group.follow()

    # --- serving: many requests, one step at a time ------------------------------------------------
    @property
    def serving(self) -> Serving:
        if self._serving is None:
            s = self.settings
            budget = s.kv_budget_bytes or int(available_memory(self.device) * 0.5)
            limits = budget_limits(self.model, s, budget)
            self._serving = Serving(self.model, s, limits, self.decode_step, s.cuda_graphs and self.device.type == "cuda")
        return self._serving

    def serving_limits(self) -> ServingLimits:
        return self.serving.limits

    def serving_state(self) -> ServingState:
        srv = self.serving
        sched, prefix = srv.scheduler, srv.prefix
        return ServingState(
            len(sched.running), len(sched.waiting), sched.tokens_held(), sched.kv_tokens,
            prefix.queries if prefix else 0, prefix.hits if prefix else 0,
        )  # fmt: skip

    @property
    def idle(self) -> bool:
        """True when nothing is waiting or running (nothing for `step()` to do)."""
        return self._serving is None or (self._serving.scheduler.idle and not self._serving.seqs)

    def submit(self, prompt, max_new_tokens: int = 64, *, arrival_s: float | None = None, **settings) -> int:
        """Queue one request; returns its id. Refused settings raise EngineError here, in one line.

        `arrival_s`: when it arrived, on `time.perf_counter()`'s clock (default: now). A load
        generator passes the planned time, so waiting behind a step in progress counts as queue time.
        """
        bad = next((k for k in settings if k in ORDER_ONLY), None)
        if bad is not None:
            raise EngineError(f"setting '{bad}' applies to one order (generate/stream), not to submit")
        req = RequestSettings(max_new_tokens=max_new_tokens, **settings)
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            raise EngineError("submit takes one prompt (text or a list of token ids); submit each prompt of a batch")
        (ids,) = encode_prompts([prompt], self.codec)
        check_request(self.cfg, [ids], req, self.limits(len(ids), max_new_tokens))
        srv = self.serving
        lim, total = srv.limits, len(ids) + max_new_tokens
        if total - 1 > lim.seat_len:  # the last token is never fed back: it needs no slot
            raise EngineError(
                f"prompt ({len(ids):,} tokens) + max_new_tokens {max_new_tokens:,} - 1 (the last is never fed back) "
                f"= {total - 1:,} exceeds a KV seat of {lim.seat_len:,} tokens (set max_seq_len at load, up to the "
                f"context of {self.cfg.max_context:,})"
            )
        if total > srv.scheduler.kv_tokens:
            raise EngineError(
                f"prompt + max_new_tokens = {total:,} tokens exceeds the KV memory of {srv.scheduler.kv_tokens:,} tokens"
            )
        first_pass = min(len(ids), srv.scheduler.config.token_budget) if srv.scheduler.config.policy == "chunked" \
            else len(ids)  # fmt: skip
        work = srv.work_bytes(first_pass, first_pass)
        if work > lim.work_bytes:
            raise EngineError(
                f"a prefill pass over this prompt ({first_pass:,} tokens) needs {work:,} bytes of working memory; "
                f"{lim.work_bytes:,} bytes are left beside the KV seats (budget {lim.budget_bytes:,} bytes)"
            )
        if req.speculate:
            srv.drafter.use(req.draft, self.cfg, self.device, self.model.dtype, self.codec)  # loads a draft model once
        rid = self._new_id()
        gen = torch.Generator(device=self.device).manual_seed(req.seed)
        seq = Sequence(
            request_id=rid, prompt=ids, max_new_tokens=max_new_tokens,
            params=SamplingParams(req.temperature, req.top_k, req.top_p), generator=gen,
            stop_ids=frozenset(self.cfg.eos_ids) if req.stop_at_eos else frozenset(),
            decoder=IncrementalDecoder(self.codec, ids),
            arrival_t=time.perf_counter() if arrival_s is None else arrival_s, speculate=req.speculate,
            draft=req.draft, reuse_prefix=bool(req.reuse_prefix), logprobs=req.logprobs,
            min_tokens=req.min_tokens,
        )  # fmt: skip
        srv.seqs[rid] = seq
        if req.logprobs >= 0 or req.min_tokens:
            srv.extras.add(rid)
        srv.scheduler.add(seq)
        return rid

    def adopt(self, prompt: list[int], first_token: int, k: torch.Tensor, v: torch.Tensor,
              max_new_tokens: int = 64, **settings) -> int:  # fmt: skip
        """Take over a request prefilled by another engine (a second kitchen): its prompt's K/V,
        `k` and `v` of shape (layers, Hkv, len(prompt), D), and the first token sampled from its
        prefill logits. It joins the running batch at once; `step()` continues its decode.
        Returns its request id. Its TTFT here is 0: the first token was made elsewhere."""
        n = len(prompt)
        if max_new_tokens < 2:
            raise EngineError(f"an adopted request decodes at least one more token: max_new_tokens >= 2 (got {max_new_tokens})")
        expected = (self.cfg.n_layers, self.cfg.n_kv_heads, n, self.cfg.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise EngineError(f"adopted K/V must be (layers, kv heads, prompt, head dim) = {expected}; got {tuple(k.shape)}")
        if settings.get("stop_at_eos", True) and first_token in self.cfg.eos_ids:
            raise EngineError("the first token already ends this request (EOS): there is nothing to decode")
        rid = self.submit(prompt, max_new_tokens, **settings)
        srv = self.serving
        seq = srv.seqs[rid]
        srv.scheduler.waiting.remove(seq)
        seq.num_cached = n
        seq.scheduled_t = seq.arrival_t
        seat = srv.scheduler.adopt(seq)
        srv.pool.k[:, seat, :, :n] = k.to(srv.pool.dtype)
        srv.pool.v[:, seat, :, :n] = v.to(srv.pool.dtype)
        srv.pool.note_written(seat, n)
        seq.append(first_token, seq.arrival_t)
        seq.decoder.feed(first_token)
        return rid

    def cancel(self, request_id: int) -> bool:
        """Stop a request; its seat is freed and its Done (finish_reason "cancelled") comes at the next
        step. False if it had already finished."""
        if not 0 <= request_id < self._next_id:
            raise EngineError(f"no request {request_id}: ids so far are 0..{self._next_id - 1}")
        seq = self._serving.seqs.get(request_id) if self._serving is not None else None
        if seq is None:
            return False
        if not seq.cancel_requested:
            seq.cancel_requested = True
            self._serving.cancelled.append(seq)
        return True

    @torch.inference_mode()
    def step(self) -> list[Event]:
        """One scheduler iteration: at most one forward pass. Returns its events ([] if idle)."""
        if self._serving is None:
            return []
        srv = self.serving
        events: list[Event] = []
        cancelled, srv.cancelled = srv.cancelled, []
        for seq in cancelled:
            srv.scheduler.remove(seq)
            seq.status, seq.finish_reason = Status.CANCELLED, "cancelled"
            events.append(self._done(seq, time.perf_counter()))
        plan = srv.scheduler.schedule(time.perf_counter())
        if not plan.work:
            return events
        t_start = self._now()
        out = srv.runner.run(plan)
        t_fwd = self._now()
        lps = row_extras(out, srv.extras) if srv.extras else {}
        picks = self._sample(out)
        t_end = self._now()
        t_abs = self._t0 + t_end
        finished = []
        for w, toks in zip(out.sampled, picks, strict=True):
            seq = w.seq
            if w.draft:  # keep the K/V of the last token and the accepted drafts; the rest is stale
                seq.spec.record(len(w.draft), len(toks) - 1)
                seq.num_cached = w.start + len(toks)
                srv.pool.note_written(seq.seat, seq.num_cached)
            rows = lps.get(seq.request_id) if lps else None
            for j, tok in enumerate(toks):
                done = seq.append(tok, t_abs)
                text = seq.decoder.feed(tok, final=done)
                if rows is None:
                    events.append(Token(t_end, 0, seq.n_output - 1, tok, text, done, seq.request_id))
                else:
                    lp, top = token_logprobs(rows, j, tok, seq.logprobs)
                    events.append(Token(t_end, 0, seq.n_output - 1, tok, text, done, seq.request_id, lp, top))
                if done:
                    finished.append(seq)
                    break
        rec = measured_step(
            self.cfg, self._itemsize, phase=plan.phase, index=self._step_index(), t_start=t_start,
            t_end=t_end, forward_s=t_fwd - t_start, batch=len(plan.work), tokens=out.tokens, slots=out.tokens,
            kv_tokens=sum([w.start + w.length for w in plan.work]),  # each row's cache after the pass
            kv_bytes=srv.pool.bytes_in_use, logits_rows=out.logits.shape[0],
            attn_pairs=out.attn_pairs, quant=self.info.quant,
        )  # fmt: skip
        events.append(StepEnd(
            t_end, rec, -1, tuple([w.seq.request_id for w in plan.work]), out.prefill_tokens, out.decode_tokens,
            tuple([s.request_id for s in plan.preempted]),
        ))  # fmt: skip
        for seq in finished:
            srv.scheduler.remove(seq)
            seq.status = Status.FINISHED
            events.append(self._done(seq, t_abs))
        return events

    def _sample(self, out: PassOutput) -> list[list[int]]:
        return pass_tokens(out)  # a method of its own: engine/bench/step_profile.py times it

    def _done(self, seq: Sequence, t_abs: float) -> Done:
        seq.finish_t = t_abs
        del self.serving.seqs[seq.request_id]
        self.serving.extras.discard(seq.request_id)
        result = RequestOutput(
            request_id=seq.request_id, prompt_ids=seq.prompt, tokens=seq.output, text=self.decode(seq.output),
            finish_reason=seq.finish_reason,
            speculation=seq.spec if seq.speculate else None,
            metrics=request_metrics(seq.arrival_t, seq.scheduled_t, seq.token_times, len(seq.prompt),
                                    seq.preemptions, seq.cached_tokens),
        )  # fmt: skip
        return Done(t_abs - self._t0, result, seq.request_id)

    def _now(self) -> float:
        """Seconds on the engine's clock; on CUDA after the queued kernels have run."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self._t0

    def _step_index(self) -> int:
        self._steps += 1
        return self._steps

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

