"""The serving counter for many orders: a pool of KV *seats*, one row per running sequence.

Layout (why seats and not blocks: docs/design/kv-cache.md has the comparison and the numbers):

    k, v   (L, seats, Hkv, seat_len, D)   one preallocated tensor each
    seat s row k[layer, s, :, :n] holds the keys of the sequence sitting there, positions 0..n-1

A sequence takes the lowest free seat when it starts, writes its K/V at its own positions, and
gives the seat back when it finishes, is cancelled or is preempted: joining or leaving copies
nothing. A decode step reads `k[layer, 0:B, :, :W]`, a *view*, when its B sequences sit in seats
0..B-1; `compact()` keeps them there (moving a sequence copies its filled prefix once, not every
step). Rows shorter than the widest one are masked.

Memory is touched lazily: the pool is `torch.empty`, and before a pass reads a slot that no
sequence ever wrote, `prepare_read` zeroes it (stale K/V of a former occupant is finite and
masked; never-written memory might hold NaN, and 0 x NaN is NaN even behind a -inf mask).

Worked example, the chef in float32 (6 layers, 4 KV heads, head dim 32): one token of one sequence
is 2 x 6 x 4 x 32 x 4 B = 6,144 B; 64 seats x 512 slots = 201 MB reserved at most.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig


@dataclass(frozen=True)
class Span:
    """A prefill chunk of one sequence inside a flat pass: positions start..start+length-1."""

    seat: int
    start: int
    length: int
    mask: torch.Tensor | None  # (1, 1, length, start + length) bool; None: causal within the span (start 0)


@dataclass(frozen=True)
class SeatBatch:
    """How a flat pass of N tokens, shape (1, N), maps onto seats: decode rows first, then spans.

    Example: two sequences decoding in seats 0 and 1 (12 and 30 tokens cached) and a 5-token
    chunk of a prompt in seat 2 starting at position 8: N = 7, decode rows write slots 12 and 30
    of seats 0 and 1 (`SeatPool.row_index_list`), decode_first 0, decode_width 31, spans [Span(2, 8, 5,
    mask)]. With no spans the pass is laid out (B, 1) instead of (1, N): the decode path's shapes.
    """

    decode_index: torch.Tensor  # (Bd * Hkv,) long: where each row's new K/V go in a layer's flat view
    decode_first: int  # the decode rows sit in seats decode_first, decode_first + 1, ... (one view)
    width: int  # slots the decode rows read: the longest row + 1 (read it as `decode_width`)
    decode_bias: torch.Tensor | None  # (Bd, 1, 1, W) additive: 0 = may attend, -inf = not
    spans: list[Span]

    rows: int  # decode rows Bd (read it as `n_decode`)
    uniform: bool = False  # the pass is laid out (B, T): the spans are B whole prompts of T tokens in seats 0..B-1

    # The decode rows' count and width are the bias's sizes whenever there is one. Read from a tensor's
    # shape, the compiled decode step (engine/compiled.py) sees them as sizes that change from step
    # to step; as plain ints it would compile a graph for every value.
    @property
    def decode_width(self) -> int:
        return self.width if self.decode_bias is None else self.decode_bias.shape[-1]

    @property
    def n_decode(self) -> int:
        return self.rows if self.decode_bias is None else self.decode_bias.shape[0]


class SeatPool:
    def __init__(self, cfg: ModelConfig, seats: int, seat_len: int, dtype, device):
        self.cfg, self.seats, self.seat_len = cfg, seats, seat_len
        self.dtype, self.device = dtype, torch.device(device)
        shape = (seats, cfg.n_kv_heads, seat_len, cfg.head_dim)  # (S, Hkv, T, D) per layer
        # CUDA memory is reserved either way: zero it once. CPU pages stay untouched until used.
        alloc = torch.zeros if self.device.type == "cuda" else torch.empty
        # One tensor per layer, each its own allocation: the compiled decode step (engine/compiled.py)
        # takes every layer's seats as an input and writes one row of each in place, which the
        # compiler does only for inputs that share no memory; views of one (L, ...) tensor made it
        # copy whole seats back at every step.
        self.k_layer = [alloc(shape, dtype=dtype, device=self.device) for _ in range(cfg.n_layers)]
        self.v_layer = [alloc(shape, dtype=dtype, device=self.device) for _ in range(cfg.n_layers)]
        self.k, self.v = Layers(self.k_layer), Layers(self.v_layer)  # read and written as (L, S, Hkv, T, D)
        self.clean = [seat_len if self.device.type == "cuda" else 0] * seats  # slots safe to read
        self.lengths = [0] * seats  # real tokens each seat holds
        self.owner: list[int | None] = [None] * seats  # request id sitting there

    # -- seats ----------------------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        return self.cfg.kv_bytes_per_token(self.dtype.itemsize)

    @property
    def bytes_reserved(self) -> int:
        return self.seats * self.seat_len * self.bytes_per_token

    @property
    def tokens_in_use(self) -> int:
        return sum(self.lengths)

    @property
    def bytes_in_use(self) -> int:
        return self.tokens_in_use * self.bytes_per_token

    @property
    def free_seats(self) -> int:
        return self.owner.count(None)

    def take(self, request_id: int) -> int:
        seat = self.owner.index(None)  # ValueError means the scheduler admitted past max_seqs
        self.owner[seat], self.lengths[seat] = request_id, 0
        return seat

    def release(self, seat: int) -> None:
        self.owner[seat], self.lengths[seat] = None, 0

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """The first n tokens' K/V of seat src into seat dst (a reused prefix), every layer."""
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst], self.clean[dst] = n, max(self.clean[dst], n)

    def swap(self, a: int, b: int) -> None:
        """Exchange the sequences (or emptiness) of seats a and b: each filled prefix is copied once."""
        na, nb = self.lengths[a], self.lengths[b]
        ka, va = self.k[:, a, :, :na], self.v[:, a, :, :na]  # stacked copies
        self.k[:, a, :, :nb], self.v[:, a, :, :nb] = self.k[:, b, :, :nb], self.v[:, b, :, :nb]
        self.k[:, b, :, :na], self.v[:, b, :, :na] = ka, va
        self.owner[a], self.owner[b] = self.owner[b], self.owner[a]
        self.lengths[a], self.lengths[b] = nb, na
        self.clean[a], self.clean[b] = max(self.clean[a], nb), max(self.clean[b], na)

    def compact(self, seats: list[int]) -> None:
        """Put the sequences now in `seats` into seats 0..len-1, so one view reads them all.

        Whatever sits in a target seat (a sequence still prefilling, or nothing) trades places.
        Usually a no-op: new sequences take the lowest free seat. Callers re-read `owner` after.
        """
        inside = set(range(len(seats)))
        outside = sorted(s for s in seats if s not in inside)
        targets = [t for t in range(len(seats)) if t not in set(seats)]
        for src, dst in zip(outside, targets, strict=True):
            self.swap(src, dst)

    # -- reads and writes (called by the model, one layer at a time) ---------------------------------------
    def prepare_read(self, seats: list[int], starts: list[int], width: int) -> None:
        """Zero never-written slots below `width` in these seats before a pass reads them. A row whose
        new token lands in slot width - 1 (starts[i] + 1 == width) writes it before reading: nothing to do."""
        for s, start in zip(seats, starts, strict=True):
            if start + 1 < width and self.clean[s] < width:
                self.k[:, s, :, self.clean[s] : width] = 0
                self.v[:, s, :, self.clean[s] : width] = 0
                self.clean[s] = width

    def row_index_list(self, slots: list[int]) -> list[int]:
        """Rows of a layer's flat (seats * Hkv * seat_len, D) view where token slots[i] of seat i goes,
        for every KV head: (B * Hkv,) ints. Decode rows sit in seats 0..B-1, so seat = row.
        Example: 4 KV heads, seat_len 512, slots [7, 30]: [7, 519, 1031, 1543, 2078, 2590, 3102, 3614]."""
        per_seat = self.cfg.n_kv_heads * self.seat_len
        heads = range(0, per_seat, self.seat_len)  # each KV head's first row within a seat
        return [seat * per_seat + slot + h for seat, slot in enumerate(slots) for h in heads]

    def write_rows(self, layer: int, index: torch.Tensor, k, v) -> None:
        """One token per row: k, v (B, Hkv, D) go to the flat rows `index` (see row_index_list)."""
        D = self.cfg.head_dim
        self.k_layer[layer].view(-1, D).index_copy_(0, index, k.reshape(-1, D))  # (S*Hkv*T, D) <- (B*Hkv, D)
        self.v_layer[layer].view(-1, D).index_copy_(0, index, v.reshape(-1, D))

    def write_span(self, layer: int, seat: int, start: int, k, v) -> None:
        """A prefill chunk of one sequence: k, v (Hkv, T, D) go to slots start..start+T-1."""
        self.k_layer[layer][seat, :, start : start + k.shape[1]] = k
        self.v_layer[layer][seat, :, start : start + k.shape[1]] = v

    def write_block(self, layer: int, k, v) -> None:
        """B whole prompts from position 0 into seats 0..B-1: k, v (B, Hkv, T, D), one copy per layer."""
        B, _, T, _ = k.shape
        self.k_layer[layer][:B, :, :T] = k
        self.v_layer[layer][:B, :, :T] = v

    def read_rows(self, layer: int, first: int, count: int, width: int):
        """Seats first..first+count-1, slots 0..width-1: views (count, Hkv, width, D), no copy."""
        return self.k_layer[layer][first : first + count, :, :width], self.v_layer[layer][first : first + count, :, :width]

    def note_written(self, seat: int, length: int) -> None:
        """Record that `seat` now holds `length` real tokens (the runner calls this after a pass)."""
        self.lengths[seat] = length
        self.clean[seat] = max(self.clean[seat], length)


class Layers:
    """Every layer's (S, Hkv, T, D) seats indexed as one (L, S, Hkv, T, D) tensor: `k[:, seat, :, :n]`
    reads a stacked copy, and assigning to it writes each layer (a stacked value gives layer i its
    row i). For the seat-wise copies (prefix reuse, compaction, an adopted request's K/V), not the
    decode step, which works per layer."""

    def __init__(self, layers: list[torch.Tensor]):
        self.layers = layers

    def _rest(self, key) -> tuple:
        key = key if isinstance(key, tuple) else (key,)
        if not key or key[0] != slice(None):
            raise IndexError("index every layer at once: [:, seat, ...]")
        return key[1:]

    def __getitem__(self, key) -> torch.Tensor:
        rest = self._rest(key)
        return torch.stack([t[rest] for t in self.layers])  # (L, ...)

    def __setitem__(self, key, value) -> None:
        rest = self._rest(key)
        stacked = isinstance(value, torch.Tensor) and value.dim() == self.layers[0][rest].dim() + 1
        for i, t in enumerate(self.layers):
            t[rest] = value[i] if stacked else value
