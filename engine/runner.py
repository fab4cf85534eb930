"""The runner: turns a scheduler's plan into one forward pass over the KV seats.

The scheduler says *who* cooks and how many tokens each feeds; the runner lays those tokens out
as one flat row -- decode tokens first, ordered by seat, then each prefill chunk -- with the
positions and seats they go to and the rows that sample (`Layout`), hands the layout to the
engine's forward in one dispatch, and records what the pass wrote. Two forwards exist: the native
step (engine/native.py, one C call a pass, CPU) and the torch forward (engine/torch_forward.py, the
model op by op, with its options: a compiled decode step, CUDA graphs, batch invariance). Which one
runs is decided once, when the runner is built.

Worked example: seats 0 and 1 decode (12 and 30 tokens cached), seat 2 feeds a 5-token chunk from
position 8 that ends its prompt. ids (7,), positions [12, 30, 8, 9, 10, 11, 12], seats
[0, 1, 2, 2, 2, 2, 2], rows [0, 1, 6]: three next tokens come out of one pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kv_pool import SeatPool
from engine.model import Transformer
from engine.native import NativeStep
from engine.scheduler import StepPlan, Work
from engine.torch_forward import DecodeInputs, TorchForward


@dataclass(frozen=True)
class PassOutput:
    logits: torch.Tensor  # (R, V): one row per sampled work, or 1 + len(draft) rows for a speculating one
    sampled: list[Work]  # the work items whose sequence samples, in the order of their rows
    tokens: int  # tokens fed (prefill + decode)
    prefill_tokens: int
    decode_tokens: int
    kv_read: int  # cache slots attended, summed over decode rows and spans
    attn_pairs: int  # (query, key) pairs scored
    graphed: bool  # replayed a CUDA graph


@dataclass(frozen=True)
class Layout:
    """One pass's tokens as the forward takes them: row i feeds ids[i] at pos[i] into seats[i]."""

    work: list[Work]
    decodes: list[Work]  # one-token decodes, by seat
    chunks: list[Work]  # prompt chunks and draft checks, after them
    ids: list[int]
    pos: list[int]
    seats: list[int]
    rows: list[int]  # the rows that get logits, ascending
    pairs: int  # (query, key) pairs the pass scores

    @classmethod
    def of(cls, work: list[Work]) -> Layout:
        decodes = sorted((w for w in work if w.is_decode and not w.draft), key=lambda w: w.seq.seat)
        chunks = [w for w in work if not w.is_decode or w.draft]
        ids = [w.seq.tokens[w.start] for w in decodes]
        pos = [w.start for w in decodes]
        rows, pairs = list(range(len(decodes))), sum(pos) + len(pos)
        seats = [w.seq.seat for w in decodes]
        offset = len(decodes)
        for w in chunks:
            ids += w.fed
            pos += range(w.start, w.start + w.length)
            seats += [w.seq.seat] * w.length
            pairs += w.length * w.start + w.length * (w.length + 1) // 2
            if w.draft:  # every position is checked against the draft
                rows += range(offset, offset + w.length)
            elif w.samples:
                rows.append(offset + w.length - 1)
            offset += w.length
        return cls(work, decodes, chunks, ids, pos, seats, rows, pairs)


class NativeForward:
    """The native step's pass: a pure-decode step through its decode entry, with the rows' inputs
    written into buffers made once; any other pass (prompts, chunks beside decode rows, draft
    checks) through `run`, its rows named by seat. Both are one C call (engine/native.py)."""

    def __init__(self, step: NativeStep, pool: SeatPool, dtype: torch.dtype):
        self.pool = pool
        self.decode_fn, self.pass_fn = step, step.run  # the step's two entries
        self.decode_in = DecodeInputs(pool, dtype)

    def __call__(self, p: Layout) -> torch.Tensor:
        if not p.chunks:
            tokens, positions, _ = self.decode_in.fill(p.ids, p.pos)
            return self.decode_fn(tokens, positions, None, self.pool)  # (B, V)
        return self.pass_fn(p.ids, p.pos, p.seats, p.rows, self.pool)  # (R, V)


class Runner:
    def __init__(self, model: Transformer, pool: SeatPool, cuda_graphs: bool = False,
                 step: TorchForward | NativeStep | None = None, invariant: bool = False):  # fmt: skip
        """`step`: the engine's decode step (engine/serving_core.py `make_decode_step`): the native step
        runs every pass where it can (float32 or int8 weights on CPU, not batch-invariant, no graphs);
        otherwise the torch forward runs, with `step` as its pure-decode function when it is one.
        `invariant`: batch-invariant mode, every query on the key grid (engine/invariance.py)."""
        self.model, self.pool = model, pool
        native = isinstance(step, NativeStep) and step.usable(pool) and not invariant and not cuda_graphs
        self.forward: Callable[[Layout], torch.Tensor] = (
            NativeForward(step, pool, model.dtype) if native else TorchForward(model, pool, cuda_graphs, step, invariant)
        )  # fmt: skip

    @property
    def graphs(self):
        """The torch forward's CUDA graphs, if it replays any."""
        return getattr(self.forward, "graphs", None)

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> PassOutput:
        p = Layout.of(plan.work)
        logits = self.forward(p)  # the one dispatch
        for w in plan.work:
            w.seq.num_cached = w.start + w.length
            self.pool.note_written(w.seq.seat, w.seq.num_cached)
        n_pre = sum(w.length for w in p.chunks if not w.is_decode)
        n_dec = sum(w.length for w in plan.work if w.is_decode)
        sampled = p.decodes + [w for w in p.chunks if w.samples]
        graphed = getattr(self.forward, "graphed", False)
        return PassOutput(logits, sampled, n_pre + n_dec, n_pre, n_dec, p.pairs, p.pairs, graphed)
