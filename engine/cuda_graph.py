"""Decode as a CUDA graph: record one decode step's ~hundreds of kernel launches once, replay them.

Why: a decode step of a small model is many tiny kernels (a GEMV, a norm, a rope, ... per layer).
On a GPU the Python + launch overhead per kernel (~5-10 us) can exceed the kernel itself, so the
soup pot waits on the cook, not on memory. A CUDA graph replays the whole recorded step with one
launch; the lab compares `cuda_graph=False` vs `True` to show how much of a step was overhead.

The price of a graph is fixed shapes and fixed addresses:
* inputs are copied into static buffers (tokens, positions, the cache slot) before each replay;
* attention reads the WHOLE cache allocation, with the `valid` mask hiding unfilled slots (the
  eager path reads only the filled prefix; here the width cannot change between replays);
* finished sequences are not dropped (that would change the batch shape): they keep decoding and
  their tokens are ignored.
"""

from __future__ import annotations

import torch

from engine.cache import StaticKVCache
from engine.kv_pool import SeatBatch, SeatPool
from engine.model import Transformer, additive_bias, decode_one_token


def record(step, dev) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Capture `step()` as a CUDA graph after two warm-up runs on a side stream (they let cuBLAS and
    SDPA pick and allocate their workspaces). Returns the graph and its static output."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


class GraphedDecode:
    """Capture `decode_one_token` for a fixed batch and cache; call it like the eager function."""

    def __init__(
        self,
        model: Transformer,
        cache: StaticKVCache,
        valid: torch.Tensor,
        first_slot: int,
        capture: bool = True,
    ):
        """`capture=False` replays the same static-buffer step eagerly (lets CPU tests check the logic)."""
        B, dev = valid.shape[0], valid.device
        self.tokens = torch.zeros(B, 1, dtype=torch.long, device=dev)  # (B, 1)
        self.positions = torch.zeros(B, 1, dtype=torch.long, device=dev)  # (B, 1)
        # Warm-up runs really execute: point them at the slot the first real step overwrites anyway.
        self.input_pos = torch.full((1,), first_slot, dtype=torch.long, device=dev)  # (1,)
        mask = valid[:, None, None, :]  # (B, 1, 1, S): a view, so flipping `valid` updates it

        def step() -> torch.Tensor:
            return decode_one_token(model, self.tokens, self.positions, self.input_pos, mask, cache)

        self.step, self.graph = step, None
        if capture:
            self.graph, self.logits = record(step, dev)  # logits (B, V): a static output buffer

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slot: int) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.input_pos.fill_(slot)
        if self.graph is None:
            return self.step()
        self.graph.replay()
        return self.logits


def buckets(max_seqs: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, ... up to the first one >= max_seqs."""
    out = [1]
    while out[-1] < max_seqs:
        out.append(out[-1] * 2)
    return out


class DecodeGraphs:
    """The serving runner's decode steps as graphs, one per batch bucket, captured on first use.

    A step of B sequences replays the graph of the smallest bucket b >= B. Its B real rows sit in
    seats 0..B-1 (the scheduler compacts them there); the b - B padding rows read seats B..b-1 and
    write their junk K/V to the last slot of those seats, which no sequence reads before writing it
    itself; their logits are dropped. Attention reads every seat's whole length (a graph's shapes
    are fixed), with the bias hiding what each row has not written.

    `capture=False` runs the same static buffers eagerly: CPU tests check the padding logic with it.
    """

    def __init__(self, model: Transformer, pool: SeatPool, capture: bool | None = None):
        self.model, self.pool = model, pool
        self.capture = pool.device.type == "cuda" if capture is None else capture
        self.sizes = buckets(pool.seats)
        self.steps: dict[int, _BucketStep] = {}

    def fits(self, batch: int) -> bool:
        return 0 < batch and self.bucket(batch) <= self.pool.seats

    def bucket(self, batch: int) -> int:
        return next(b for b in self.sizes if b >= batch)

    def replay(self, seats: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Logits (B, V) of one decode step whose rows sit in `seats` == 0..B-1."""
        assert seats == list(range(len(seats))), "decode rows must be compacted into seats 0..B-1"
        b = self.bucket(len(seats))
        if b not in self.steps:
            self.pool.prepare_read(list(range(b)), [0] * b, self.pool.seat_len)
            self.steps[b] = _BucketStep(self.model, self.pool, b, self.capture)
        return self.steps[b](tokens, positions)[: len(seats)]


class _BucketStep:
    def __init__(self, model: Transformer, pool: SeatPool, b: int, capture: bool):
        dev, width = pool.device, pool.seat_len
        self.tokens = torch.zeros(b, 1, dtype=torch.long, device=dev)  # (b, 1)
        self.positions = torch.zeros(b, 1, dtype=torch.long, device=dev)  # (b, 1)
        self.index = torch.zeros(b * pool.cfg.n_kv_heads, dtype=torch.long, device=dev)  # (b * Hkv,)
        self.valid = torch.zeros(b, width, dtype=torch.bool, device=dev)  # (b, W)
        self.bias = torch.zeros(b, 1, 1, width, dtype=model.dtype, device=dev)  # (b, 1, 1, W)
        self.b, self.width, self.pool = b, width, pool
        sb = SeatBatch(self.index, 0, width, self.bias, [], b)
        rows = torch.arange(b, device=dev)

        def step() -> torch.Tensor:
            return model.forward_seats(self.tokens, self.positions, sb, pool, rows)

        self.step, self.graph = step, None
        self._fill([0] * b, [0] * b)
        if capture:
            self.graph, self.logits = record(step, dev)  # logits (b, V): a static output buffer

    def _fill(self, tokens: list[int], positions: list[int]) -> None:
        n, dev = len(tokens), self.tokens.device
        pad = self.b - n
        self.tokens.copy_(torch.tensor(tokens + [0] * pad, device=dev)[:, None])
        pos = torch.tensor(positions + [self.width - 1] * pad, device=dev)  # (b,)
        self.positions.copy_(pos[:, None])
        self.index.copy_(torch.tensor(self.pool.row_index_list(positions + [self.width - 1] * pad), device=dev))
        self.valid.copy_(torch.arange(self.width, device=dev)[None, :] <= pos[:, None])
        self.bias.copy_(additive_bias(self.valid, self.bias.dtype)[:, None, None, :])

    def __call__(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        self._fill(tokens, positions)
        if self.graph is None:
            return self.step()
        self.graph.replay()
        return self.logits
