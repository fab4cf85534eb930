"""Batch-invariant answers: a request's tokens and log-probabilities do not depend on its neighbours.

Why this is not free: a served request shares each step's matrix products with whoever else is
cooking, and a float32 GEMM on CPU sums each output in an order chosen for the product's shape.
MKL picks a different kernel for one row (a GEMV) than for eight, and a different blocking again
for sixty-four, so row 0 of `x[:8] @ W` is not bit-equal to `x[:1] @ W`. The difference is in the
last bit or two, and it matters only where two tokens are that close: at a float32 tie the batch's
rounding picks the other token, and the answer forks from the same prompt served alone.

MKL's strict conditional numerical reproducibility (`MKL_CBWR=AUTO,STRICT`) fixes the summation
order per output, whatever the number of rows, on Intel CPUs. Where MKL ignores it (AMD CPUs),
the same holds from a few rows up: every count of 4 rows or more sums a row the same way, and
only 1 to 3 rows take other kernels. So the mode measures that floor (`row_floor`) and runs every
smaller product with zero rows added up to it (engine/quant.py `set_row_floor`). Norms, RoPE,
the activation and sampling are row-wise already. Attention is not: a query's softmax and its product with V sum over however
many key slots the call reads, masked or not, and that count depends on the neighbours (the
longest decode row), on where a prompt's chunk ends, and on how long the prompt that filled a
reused prefix was. So in this mode every query attends on a fixed key grid (`attend_on_grid`):
the token at position p reads key slots 0..grid_end(p)-1 and masks those after p, and it is one
query of its own in the call (batch entry, not a row among a prompt's queries: the kernel splits
a call's queries into blocks whose sums can change with how many rows a block holds). Example, with
GRID 64: position 70 reads 128 slots, whether it is a decode row beside rows at 900, the last of
an 80-token chunk, or the 71st token of a prompt whose first 64 came from the prefix cache. The
same query with the same keys then takes the same sums. The engine's tests serve prompts alone
and together, chunked and with reused prefixes, and compare log-probabilities bit for bit.

    eng = Engine.load("chef", batch_invariant=True)   # in a process that has not multiplied yet

The cost: a single row's product runs as a GEMM (strict mode's, or the floor's) rather than a
GEMV, and attention runs one call per grid block of a prompt and per group of decode rows on the
same block (measured in
docs/benchmarks/batch-invariance-cpu.md). MKL reads the variable at its first product, so it must be set
before the process multiplies anything; `require()` sets it if unset, then checks that it took.
Float32 on CPU only: bfloat16 and int8 products run on oneDNN kernels that MKL's mode does not reach.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.errors import EngineError
from engine.kv_pool import SeatBatch, SeatPool, Span
from engine.quant import matmul, set_row_floor

MKL_ENV = "MKL_CBWR"
STRICT = "AUTO,STRICT"  # MKL's best code path for this CPU, with a fixed summation order per output
PROBE_ROWS = (1, 3, 8, 64)  # GEMV, a small GEMM, and two larger blockings
FLOORS = (1, 2, 4, 8, 16)  # the row floors tried, fewest first (engine.quant.set_row_floor)
FLOOR_PROBE = (3, 5, 8, 17, 64, 129, 512)  # row counts a floor must agree over
GRID = 64  # key slots per grid block: a query reads up to the end of its position's block


def products_invariant(width: int = 256) -> bool:
    """Is row 0 of a float32 product (engine.quant.matmul, under this process's row floor) the same
    bits for every number of rows? Measured, not assumed."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(PROBE_ROWS), width, generator=gen)  # (M, K)
    w = torch.randn(width, 3 * width, generator=gen)  # (K, N)
    first = matmul(x[:1], w)  # (1, N)
    return all(torch.equal(matmul(x[:m], w)[:1], first) for m in PROBE_ROWS[1:])


def row_floor(product=None, width: int = 256) -> int | None:
    """The fewest rows from which row 0 of `product(x[:m], w)` (default: `x @ w`) is the same bits for
    every m probed, among FLOORS; None if even the largest does not hold.

    Example, measured: with MKL's strict mode (Intel CPUs) every count agrees, floor 1; on an AMD
    EPYC, where MKL ignores the strict mode, 1 to 3 rows take other kernels and 4 or more agree,
    floor 4."""
    product = product or (lambda a, b: a @ b)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(FLOOR_PROBE[-1], width, generator=gen)  # (M, K)
    w = torch.randn(width, 3 * width, generator=gen)  # (K, N)
    ref = product(x[:64], w)[:1]  # (1, N)
    for floor in FLOORS:
        if all(torch.equal(product(x[:m], w)[:1], ref) for m in (floor, *(m for m in FLOOR_PROBE if m > floor))):
            return floor
    return None


def no_floor_line() -> str:
    return (f"batch-invariant mode needs products that sum a row the same way from at most {FLOORS[-1]} rows up, "
            f"and this process's do not ({MKL_ENV}={os.environ.get(MKL_ENV)!r}): start the process with "
            f"{MKL_ENV}={STRICT} before its first matrix product")  # fmt: skip


def require(device: str, dtype: str, quant: str | None, compile: bool) -> None:
    """Make this process's products batch-invariant, or say in one line why it cannot be."""
    if not str(device).startswith("cpu") or dtype != "float32" or quant:
        raise EngineError(f"batch-invariant mode runs float32 on CPU only (asked: {dtype}"
                          f"{', ' + quant if quant else ''} on {device})")  # fmt: skip
    if compile:
        raise EngineError("batch-invariant mode runs the eager step: a compiled step fuses and reorders its sums")
    if not torch.backends.mkl.is_available():
        raise EngineError("batch-invariant mode needs a torch built with MKL (its strict reproducibility mode)")
    os.environ.setdefault(MKL_ENV, STRICT)
    floor = row_floor()
    if floor is None:
        raise EngineError(no_floor_line())
    set_row_floor(floor)
    if not products_invariant():
        raise EngineError(f"batch-invariant mode could not make this process's products agree (row floor {floor})")


def grid_end(position: int, seat_len: int) -> int:
    """Key slots the token at `position` reads: the end of its grid block (at most the seat)."""
    return min(seat_len, (position // GRID + 1) * GRID)


@dataclass(frozen=True)
class GridCall:
    """One attention call on the grid: `queries` rows of the pass, over slots 0..end-1 of `seats`.

    Decode rows whose grid ends match share a call (seats (g,), one query each); a prompt span
    makes one call per grid block it touches (one seat, its t queries each a batch entry of their
    own over that seat's keys). mask (g or t, 1, 1, end) bool: a query sees the slots up to its
    own position. Every query is so computed the same way, a decode row or a prompt token."""

    queries: slice | torch.Tensor  # rows of the pass: a slice where they are consecutive, else (g,)
    seats: slice | torch.Tensor  # the same for their seats (a slice reads the seats as a view)
    end: int
    mask: torch.Tensor
    decode: bool  # one query per seat (decode rows), else one seat's t queries (a span block)


def grid_plan(decode_positions: list[int], decode_first: int, spans: list[Span], seat_len: int, device) -> list[GridCall]:
    """The step's grid calls, made once and used by every layer. Decode rows are the first
    len(decode_positions) rows of the pass, then the spans' tokens in order."""
    calls, nd = [], len(decode_positions)
    for end in sorted({grid_end(p, seat_len) for p in decode_positions}):
        rows = [b for b, p in enumerate(decode_positions) if grid_end(p, seat_len) == end]
        pos = torch.tensor([decode_positions[b] for b in rows], device=device)  # (g,)
        if rows == list(range(rows[0], rows[-1] + 1)):  # consecutive rows in consecutive seats: views
            at, seats = slice(rows[0], rows[-1] + 1), slice(decode_first + rows[0], decode_first + rows[-1] + 1)
        else:
            at = torch.tensor(rows, device=device)  # (g,)
            seats = at + decode_first
        calls.append(GridCall(at, seats, end, _mask(pos[:, None], end), True))
    offset = nd
    for sp in spans:
        a, stop = sp.start, sp.start + sp.length
        while a < stop:  # one call per grid block the span touches
            end = grid_end(a, seat_len)
            b = min(stop, end)
            rows = slice(offset + a - sp.start, offset + b - sp.start)
            seat = slice(sp.seat, sp.seat + 1)
            calls.append(GridCall(rows, seat, end, _mask(torch.arange(a, b, device=device)[:, None], end), False))
            a = b
        offset += sp.length
    return calls


def _mask(positions: torch.Tensor, end: int) -> torch.Tensor:
    """positions (g, t) -> (g, 1, t, end) bool: slot j is visible to the query at p iff j <= p."""
    return (torch.arange(end, device=positions.device) <= positions[..., None])[:, None]


def attend_on_grid(layer: int, q, k, v, sb: SeatBatch, pool: SeatPool, calls: list[GridCall]) -> torch.Tensor:
    """`SeatKV.attend` in batch-invariant mode: this pass's K/V are written as usual, then each grid
    call attends its queries over the slots up to its end. q (B, H, 1, D) with k, v (B, Hkv, 1, D)
    when every row decodes, else (1, H, N, D) with (1, Hkv, N, D): decode rows first, then the
    spans. -> (B, 1, H*D) or (1, N, H*D)."""
    nd, H, D = sb.n_decode, q.shape[1], q.shape[3]
    if sb.spans:  # the flat layout: one row of N tokens
        q_rows, k_rows, v_rows = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)  # (N, H or Hkv, D)
    else:  # every row decodes: (B, H or Hkv, D)
        q_rows, k_rows, v_rows = q[:, :, 0], k[:, :, 0], v[:, :, 0]
    if nd:
        pool.write_rows(layer, sb.decode_index, k_rows[:nd], v_rows[:nd])
    offset = nd
    for sp in sb.spans:
        s = slice(offset, offset + sp.length)
        pool.write_span(layer, sp.seat, sp.start, k_rows[s].transpose(0, 1), v_rows[s].transpose(0, 1))
        offset += sp.length
    gqa, N = H != pool.cfg.n_kv_heads, q_rows.shape[0]
    out = None if len(calls) == 1 else torch.empty_like(q_rows)  # (N, H, D); one call: its own result
    for c in calls:
        if isinstance(c.seats, slice):  # (g, Hkv, S, D) views
            keys, values = pool.k_layer[layer][c.seats, :, : c.end], pool.v_layer[layer][c.seats, :, : c.end]
        else:  # (g, Hkv, S, D) gathered
            keys = pool.k_layer[layer][:, :, : c.end].index_select(0, c.seats)
            values = pool.v_layer[layer][:, :, : c.end].index_select(0, c.seats)
        qs = q_rows[c.queries][:, :, None]  # (g or t, H, 1, D): one query per batch entry
        if not c.decode:  # a span's t queries all read its one seat
            keys, values = keys.expand(len(qs), -1, -1, -1), values.expand(len(qs), -1, -1, -1)  # (t, Hkv, S, D)
        o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=c.mask, enable_gqa=gqa)[:, :, 0]  # (g or t, H, D)
        if out is None:
            return o.reshape(1, N, H * D) if sb.spans else o.reshape(N, 1, H * D)
        out[c.queries] = o
    return out.reshape(1, N, H * D) if sb.spans else out.reshape(N, 1, H * D)  # (1, N, H*D) or (B, 1, H*D)
