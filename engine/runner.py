"""The stove: turns a scheduler's plan into one forward pass over the KV seats.

The scheduler says *who* cooks and how many tokens each feeds; the runner lays those tokens out
as one flat row (1, N) -- decode tokens first, ordered by seat, then each prefill chunk -- builds
the `SeatBatch` that tells attention where each token's K/V live, runs the model once, and returns
the logits of the rows that sample. A pure decode step on CUDA replays a captured graph of the
smallest batch bucket (1, 2, 4, 8, ...) that holds it, padded up (engine/cuda_graph.py).

Worked example: seats 0 and 1 decode (12 and 30 tokens cached), seat 2 feeds a 5-token chunk from
position 8 that ends its prompt. tokens (1, 7), positions [[12, 30, 8, 9, 10, 11, 12]],
logits rows [0, 1, 6]: three next tokens come out of one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import SeatKV
from engine.compiled import CompiledDecode
from engine.cuda_graph import DecodeGraphs
from engine.invariance import grid_end, grid_plan
from engine.kv_pool import SeatBatch, SeatPool, Span
from engine.model import Transformer
from engine.native import NativeStep
from engine.scheduler import StepPlan, Work


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


class Runner:
    def __init__(self, model: Transformer, pool: SeatPool, cuda_graphs: bool = False,
                 compiled: CompiledDecode | NativeStep | None = None, invariant: bool = False):  # fmt: skip
        """`compiled`: run pure-decode steps through the engine's decode step: torch.compile'd
        (engine/compiled.py) or native (engine/native.py); None: the model's forward.
        `invariant`: batch-invariant mode, every query on the key grid (engine/invariance.py)."""
        self.model, self.pool, self.device = model, pool, model.device
        self.invariant = invariant
        self.compiled = compiled
        # the native step runs every pass on CPU, prefill and mixed ones too (engine/native.py)
        native = isinstance(compiled, NativeStep) and compiled.usable(pool) and not invariant and not cuda_graphs
        self.native = compiled if native else None
        self.graphs = None
        if cuda_graphs:
            self.graphs = DecodeGraphs(model, pool, decode=compiled if isinstance(compiled, CompiledDecode) else None)
        self.slots = torch.arange(pool.seat_len, device=self.device)  # (T,) reused by every step's masks
        self.zero = torch.zeros((), dtype=model.dtype, device=self.device)
        self.neg_inf = torch.full((), float("-inf"), dtype=model.dtype, device=self.device)
        self.decode_in = DecodeInputs(pool, model.dtype) if self.device.type == "cpu" else None

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> PassOutput:
        if self.invariant:  # the key grid reads past a row's own slots: never-written ones must be 0
            for w in plan.work:
                self.pool.prepare_read([w.seq.seat], [w.start], grid_end(w.start + w.length - 1, self.pool.seat_len))
        if self.decode_in is not None and self.graphs is None and all(w.is_decode and not w.draft for w in plan.work):
            return self._run_decode(plan.work)
        decodes = sorted((w for w in plan.work if w.is_decode and not w.draft), key=lambda w: w.seq.seat)
        chunks = [w for w in plan.work if not w.is_decode or w.draft]  # prompt chunks and draft checks
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
        sampled = decodes + [w for w in chunks if w.samples]
        graphed = self.graphs is not None and not chunks and self.graphs.fits(len(decodes))
        if graphed:
            logits = self.graphs.replay([w.seq.seat for w in decodes], ids, pos)
        elif self.native is not None:  # rows name their seats: no spans, masks or layouts to build
            logits = self.native.run(ids, pos, seats, rows, self.pool)
        else:
            spans = [Span(w.seq.seat, w.start, w.length, self._span_mask(w)) for w in chunks]
            # B whole prompts of one length in seats 0..B-1 (an order's wok, or a rush of equal prompts):
            # laid out (B, T) so attention is one batched causal pass instead of one call per prompt
            uniform = not decodes and len(chunks) > 1 and not self.invariant and all(
                w.start == 0 and not w.draft and w.length == chunks[0].length and w.seq.seat == i
                for i, w in enumerate(chunks)
            )
            logits = self._forward(decodes, spans, ids, pos, None if not chunks else rows, uniform)
        for w in plan.work:
            w.seq.num_cached = w.start + w.length
            self.pool.note_written(w.seq.seat, w.seq.num_cached)
        n_pre = sum(w.length for w in chunks if not w.is_decode)
        n_dec = sum(w.length for w in plan.work if w.is_decode)
        return PassOutput(logits, sampled, n_pre + n_dec, n_pre, n_dec, pairs, pairs, graphed)

    def _run_decode(self, work: list[Work]) -> PassOutput:
        """A pure decode step on CPU: the general path's pass, its inputs written into buffers made once."""
        decodes = work if len(work) == 1 else sorted(work, key=lambda w: w.seq.seat)
        pos = [w.start for w in decodes]
        logits = self._forward_decode(decodes, pos)
        for w in decodes:
            w.seq.num_cached = w.start + 1
            self.pool.note_written(w.seq.seat, w.start + 1)
        n, pairs = len(decodes), sum(pos) + len(pos)
        return PassOutput(logits, decodes, n, 0, n, pairs, pairs, False)

    def _forward_decode(self, decodes: list[Work], pos: list[int]) -> torch.Tensor:
        nd = len(decodes)
        assert all(w.seq.seat == i for i, w in enumerate(decodes)), "the scheduler seats decode rows in 0..B-1"
        width = max(pos) + 1
        self.pool.prepare_read(list(range(nd)), pos, width)
        tokens, positions, index = self.decode_in.fill([w.seq.tokens[w.start] for w in decodes], pos)
        if nd == 1:  # one row sees every slot up to its own: nothing is masked
            bias = self.decode_in.zeros[:, :, :, :width]  # (1, 1, 1, W)
        else:
            bias = torch.where(self.slots[:width] <= positions, self.zero, self.neg_inf)  # (Bd, W) additive
            bias = bias[:, None, None, :]  # (Bd, 1, 1, W)
        sb = SeatBatch(index, 0, width, bias, [], nd)
        if self.compiled is not None:
            return self.compiled(tokens, positions, sb, self.pool).view(nd, -1)  # (B, V)
        return self.model.forward(tokens, positions, self._kv(sb, pos)).view(nd, -1)  # (B, V)

    def _forward(self, decodes: list[Work], spans: list[Span], ids: list[int], pos: list[int],
                 rows: list[int] | None, uniform: bool = False) -> torch.Tensor:  # fmt: skip
        """The eager pass. `rows` None: every row decodes, laid out (B, 1) like the decode path.
        `uniform`: B whole prompts of one length, laid out (B, T) like the fixed batch's prefill."""
        dev, nd, n = self.device, len(decodes), len(ids)
        assert all(w.seq.seat == i for i, w in enumerate(decodes)), "the scheduler seats decode rows in 0..B-1"
        width = max(pos[:nd], default=-1) + 1
        self.pool.prepare_read([w.seq.seat for w in decodes], pos[:nd], width)
        # tokens, positions and the decode rows' K/V write index in one host-to-device copy
        flat = np.array(ids + pos + self.pool.row_index_list(pos[:nd]), dtype=np.int64)
        inputs = torch.from_numpy(flat).to(dev)
        index, bias = inputs[2 * n :], None
        if nd:
            slots = inputs[n : n + nd, None]  # (Bd, 1) each decode row's new slot = its position
            bias = torch.where(self.slots[None, :width] <= slots, self.zero, self.neg_inf)  # (Bd, W) additive
            bias = bias[:, None, None, :]  # (Bd, 1, 1, W)
        inputs = inputs[: 2 * n].view(2, n)  # (2, N)
        sb = SeatBatch(index, 0, width, bias, spans, nd, uniform)
        if uniform:
            B = len(spans)
            logits_rows = torch.tensor(rows, dtype=torch.long, device=dev)  # (B,) each prompt's last token
            return self.model(inputs[0].view(B, -1), inputs[1].view(B, -1), SeatKV(sb, self.pool), logits_rows)
        if rows is None:
            tokens, positions = inputs[0].view(-1, 1), inputs[1].view(-1, 1)  # (B, 1)
            if self.compiled is not None:
                return self.compiled(tokens, positions, sb, self.pool).view(nd, -1)  # (B, V)
            return self.model(tokens, positions, self._kv(sb, pos[:nd])).view(nd, -1)  # (B, V)
        logits_rows = torch.tensor(rows, dtype=torch.long, device=dev)  # (R,)
        return self.model(inputs[0][None], inputs[1][None], self._kv(sb, pos[:nd]), logits_rows)

    def _kv(self, sb: SeatBatch, decode_pos: list[int]) -> SeatKV:
        """The pass's KV view; in batch-invariant mode with the step's calls on the key grid."""
        if not self.invariant:
            return SeatKV(sb, self.pool)
        return SeatKV(sb, self.pool, grid_plan(decode_pos, sb.decode_first, sb.spans, self.pool.seat_len, self.device))

    def _span_mask(self, w: Work) -> torch.Tensor | None:
        """A chunk that continues a sequence sees its cached prefix plus itself, causally."""
        if w.start == 0:
            return None
        keys = torch.arange(w.start + w.length, device=self.device)  # (S,)
        queries = w.start + torch.arange(w.length, device=self.device)  # (T,)
        return (keys[None, :] <= queries[:, None])[None, None]  # (1, 1, T, S)


class DecodeInputs:
    """A pure decode step's integer inputs, in tensors made once per runner and refilled each step.

    A step of B rows writes its token ids, positions and K/V rows (SeatPool.row_index_list) into the
    numpy views of three buffers; the tensors the pass gets are views of their first rows, one set per
    batch size, made the first time it occurs. No tensor is built from a Python list, and no copy is
    made, on the step's path (CPU only: on CUDA the buffers would have to be copied over anyway).
    """

    def __init__(self, pool: SeatPool, dtype: torch.dtype):
        S, hkv = pool.seats, pool.cfg.n_kv_heads
        self.pool = pool
        self.tokens = torch.zeros(S, 1, dtype=torch.long)  # (S, 1)
        self.positions = torch.zeros(S, 1, dtype=torch.long)  # (S, 1)
        self.index = torch.zeros(S * hkv, dtype=torch.long)  # (S * Hkv,)
        self.np = (self.tokens.numpy().reshape(-1), self.positions.numpy().reshape(-1), self.index.numpy())  # (S,) (S,) (S*Hkv,)
        self.zeros = torch.zeros(1, 1, 1, pool.seat_len, dtype=dtype)  # (1, 1, 1, T): one row's bias, nothing masked
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def fill(self, ids: list[int], pos: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (B, 1), positions (B, 1) and the rows' K/V index (B * Hkv,) of this step."""
        B = len(ids)
        views = self.views.get(B)
        if views is None:
            hkv = self.pool.cfg.n_kv_heads
            views = self.views[B] = (self.tokens[:B], self.positions[:B], self.index[: B * hkv])
        tok, p, idx = self.np
        tok[:B] = ids
        p[:B] = pos
        idx[: views[2].shape[0]] = self.pool.row_index_list(pos)
        return views
