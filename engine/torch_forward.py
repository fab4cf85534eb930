"""The torch forward: the reference pass, and its options (a compiled decode step, CUDA graphs, batch invariance).

The engine has two forwards. The native step (engine/native.py) runs a whole pass as one C call on
CPU; this is the other, the model's own forward (engine/model.py) op by op, which runs everywhere
and is what the native step is tested against. Its options change how a pass runs, never what it
computes (each is tested against the plain forward):

  compiled      pure-decode steps through one torch.compile'd function of the weights
                (engine/compiled.py `CompiledDecode`, `EngineSettings.compile`)
  CUDA graphs   pure-decode steps replayed from a graph of the smallest batch bucket that holds
                them (engine/cuda_graph.py `DecodeGraphs`, on CUDA)
  invariant     every query attends on a fixed key grid (engine/invariance.py)

`TorchForward(layout)` is the pass the runner dispatches to (engine/runner.py): a pure-decode step
goes through the graphs, else the decode step's function, else the model with its inputs written
into buffers made once; any other pass (prompt chunks, draft checks) through the model, its
attention told where each token's K/V live (engine/attention.py `SeatKV`).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.attention import SeatKV
from engine.compiled import CompiledDecode
from engine.cuda_graph import DecodeGraphs
from engine.invariance import grid_end, grid_plan
from engine.kv_pool import SeatBatch, SeatPool, Span
from engine.model import Transformer


class TorchForward:
    def __init__(self, model: Transformer, pool: SeatPool, cuda_graphs: bool = False, decode_step=None,
                 invariant: bool = False):  # fmt: skip
        """`decode_step`: what runs pure-decode steps instead of the model op by op (a `CompiledDecode`,
        or a `NativeStep` that cannot run this pool and falls back to the model itself); None: the model."""
        self.model, self.pool, self.device = model, pool, model.device
        self.invariant, self.decode_step = invariant, decode_step
        self.graphs = None
        if cuda_graphs:
            self.graphs = DecodeGraphs(model, pool, decode=decode_step if isinstance(decode_step, CompiledDecode) else None)
        self.graphed = False  # the last pass replayed a graph
        self.slots = torch.arange(pool.seat_len, device=self.device)  # (T,) reused by every step's masks
        self.zero = torch.zeros((), dtype=model.dtype, device=self.device)
        self.neg_inf = torch.full((), float("-inf"), dtype=model.dtype, device=self.device)
        self.decode_in = DecodeInputs(pool, model.dtype) if self.device.type == "cpu" else None

    @torch.inference_mode()
    def __call__(self, p) -> torch.Tensor:
        """Logits of the rows `p.rows` of one pass laid out by the runner (engine/runner.py `Layout`)."""
        self.graphed = False
        if self.invariant:  # the key grid reads past a row's own slots: never-written ones must be 0
            for w in p.work:
                self.pool.prepare_read([w.seq.seat], [w.start], grid_end(w.start + w.length - 1, self.pool.seat_len))
        if not p.chunks:
            if self.graphs is not None and self.graphs.fits(len(p.decodes)):
                self.graphed = True
                return self.graphs.replay(p.seats, p.ids, p.pos)
            if self.decode_in is not None and self.graphs is None:
                return self._decode(p)
            return self._forward(p, rows=None)
        return self._forward(p, rows=p.rows)

    def _decode(self, p) -> torch.Tensor:
        """A pure decode step on CPU: its inputs written into buffers made once."""
        nd, pos = len(p.decodes), p.pos
        assert all(w.seq.seat == i for i, w in enumerate(p.decodes)), "the scheduler seats decode rows in 0..B-1"
        width = max(pos) + 1
        self.pool.prepare_read(list(range(nd)), pos, width)
        tokens, positions, index = self.decode_in.fill(p.ids, pos)
        if nd == 1:  # one row sees every slot up to its own: nothing is masked
            bias = self.decode_in.zeros[:, :, :, :width]  # (1, 1, 1, W)
        else:
            bias = torch.where(self.slots[:width] <= positions, self.zero, self.neg_inf)  # (Bd, W) additive
            bias = bias[:, None, None, :]  # (Bd, 1, 1, W)
        sb = SeatBatch(index, 0, width, bias, [], nd)
        if self.decode_step is not None:
            return self.decode_step(tokens, positions, sb, self.pool).view(nd, -1)  # (B, V)
        return self.model.forward(tokens, positions, self._kv(sb, pos)).view(nd, -1)  # (B, V)

    def _forward(self, p, rows: list[int] | None) -> torch.Tensor:
        """The eager pass. `rows` None: every row decodes, laid out (B, 1) like the decode path. B whole
        prompts of one length in seats 0..B-1 (an order's wok, or a rush of equal prompts) are laid
        out (B, T), so attention is one batched causal pass instead of one call per prompt."""
        dev, decodes, chunks, ids, pos = self.device, p.decodes, p.chunks, p.ids, p.pos
        nd, n = len(decodes), len(ids)
        assert all(w.seq.seat == i for i, w in enumerate(decodes)), "the scheduler seats decode rows in 0..B-1"
        width = max(pos[:nd], default=-1) + 1
        self.pool.prepare_read([w.seq.seat for w in decodes], pos[:nd], width)
        spans = [Span(w.seq.seat, w.start, w.length, self._span_mask(w)) for w in chunks]
        uniform = not decodes and len(chunks) > 1 and not self.invariant and all(
            w.start == 0 and not w.draft and w.length == chunks[0].length and w.seq.seat == i for i, w in enumerate(chunks)
        )  # fmt: skip
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
            if self.decode_step is not None:
                return self.decode_step(tokens, positions, sb, self.pool).view(nd, -1)  # (B, V)
            return self.model(tokens, positions, self._kv(sb, pos[:nd])).view(nd, -1)  # (B, V)
        logits_rows = torch.tensor(rows, dtype=torch.long, device=dev)  # (R,)
        return self.model(inputs[0][None], inputs[1][None], self._kv(sb, pos[:nd]), logits_rows)

    def _kv(self, sb: SeatBatch, decode_pos: list[int]) -> SeatKV:
        """The pass's KV view; in batch-invariant mode with the step's calls on the key grid."""
        if not self.invariant:
            return SeatKV(sb, self.pool)
        return SeatKV(sb, self.pool, grid_plan(decode_pos, sb.decode_first, sb.spans, self.pool.seat_len, self.device))

    def _span_mask(self, w) -> torch.Tensor | None:
        """A chunk that continues a sequence sees its cached prefix plus itself, causally."""
        if w.start == 0:
            return None
        keys = torch.arange(w.start + w.length, device=self.device)  # (S,)
        queries = w.start + torch.arange(w.length, device=self.device)  # (T,)
        return (keys[None, :] <= queries[:, None])[None, None]  # (1, 1, T, S)


class DecodeInputs:
    """A pure decode step's integer inputs, in tensors made once per forward and refilled each step.

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
