"""Seats or blocks? What the KV layout costs one decode step's attention, measured on this machine.

    python -m engine.bench.kv_layout [--json]

Two layouts for a cache that sequences join and leave at any step (docs/design/kv-cache.md):

  seats   (S, Hkv, T, D) per layer; the B decoding sequences sit in seats 0..B-1, so the step
          reads `k[:B, :, :W]`: a view, no copy.
  blocks  (N, Hkv, 16, D) per layer plus a block table (B, W / 16) (vLLM's paged layout). Torch
          on CPU has no paged-attention kernel, so the step must first gather each sequence's
          blocks into a contiguous (B, Hkv, W, D) tensor: a copy of everything it attends to.

Each is timed as the attention of one decode step over every layer (write the new K/V, read the
cache, two matmuls and a softmax), with the engine's own `decode_attention`, the two layouts
alternating, median of 20 repeats each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from engine.attention import decode_attention

BLOCK = 16


@dataclass(frozen=True)
class KVShape:
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int


SHAPES = (KVShape("chef", 6, 8, 4, 32), KVShape("smollm2-135m", 30, 9, 3, 64))


@dataclass(frozen=True)
class LayoutTiming:
    shape: str
    batch: int
    context: int
    seats_ms: float
    blocks_ms: float

    @property
    def blocks_vs_seats(self) -> float:
        return self.blocks_ms / self.seats_ms


def _interleaved_ms(a, b, repeats: int) -> tuple[float, float]:
    """Median ms of a() and of b(), run alternately so a noisy moment hits both alike."""
    for _ in range(3):
        a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, ts in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def time_layouts(shape: KVShape, batch: int, context: int, repeats: int = 20) -> LayoutTiming:
    L, H, Hkv, D = shape.layers, shape.heads, shape.kv_heads, shape.head_dim
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, H, 1, D, generator=g)  # (B, H, 1, D)
    new = torch.randn(batch, Hkv, D, generator=g)  # (B, Hkv, D)
    bias = torch.zeros(batch, 1, 1, context)  # (B, 1, 1, W)
    seats = [torch.randn(batch, Hkv, context, D, generator=g) for _ in range(L)]  # (S, Hkv, T, D)
    nb = context // BLOCK
    blocks = [torch.randn(batch * nb, Hkv, BLOCK, D, generator=g) for _ in range(L)]  # (N, Hkv, 16, D)
    table = torch.randperm(batch * nb, generator=g).view(batch, nb)  # (B, nb): scattered blocks
    last = context - 1

    def seat_step():
        for k in seats:
            k[:, :, last] = new
            decode_attention(q, k[:batch, :, :context], k[:batch, :, :context], bias)

    def block_step():
        for k in blocks:
            k[table[:, -1], :, BLOCK - 1] = new
            gathered = k[table].permute(0, 2, 1, 3, 4).reshape(batch, Hkv, context, D)  # (B, Hkv, W, D): a copy
            decode_attention(q, gathered, gathered, bias)

    with torch.inference_mode():
        return LayoutTiming(shape.name, batch, context, *_interleaved_ms(seat_step, block_step, repeats))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.kv_layout", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = [time_layouts(s, b, c) for s in SHAPES for b in (1, 32) for c in (128, 512)]
    if args.json:
        print(json.dumps([asdict(r) | {"blocks_vs_seats": r.blocks_vs_seats} for r in rows]))
        return 0
    print(f"{'shape':<14} {'batch':>5} {'context':>7} {'seats ms':>9} {'blocks ms':>10} {'blocks/seats':>13}")
    for r in rows:
        print(f"{r.shape:<14} {r.batch:>5} {r.context:>7} {r.seats_ms:>9.3f} {r.blocks_ms:>10.3f} {r.blocks_vs_seats:>13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
