"""Decode as a CUDA graph: record one decode step's ~hundreds of kernel launches once, replay them.

Why: a decode step of a small model is many tiny kernels (a GEMV, a norm, a rope, ... per layer).
On a GPU the Python + launch overhead per kernel (~5-10 us) can exceed the kernel itself, so the
soup pot waits on the cook, not on memory. A CUDA graph replays the whole recorded step with one
launch; the lab compares `cuda_graph=False` vs `True` to show how much of a step was overhead.

The price of a graph is fixed shapes and fixed addresses:
* inputs are copied into static buffers (tokens, positions, the cache slot) before each replay;
* attention reads every seat's WHOLE length, with the bias hiding unfilled slots (the eager
  path reads only the filled prefix; here the width cannot change between replays);
* a step of B rows replays the graph of the smallest bucket b >= B (1, 2, 4, ...), padded up.

A capture can fail (one did on an H200: `cudaErrorStreamCaptureInvalidated` after other models had
run in the same process). Then that graph's step runs eagerly from the same static buffers, the
failure is kept as one line (an order writes it into its trace's notes), and that bucket's steps
run eagerly: no step replays a broken graph, and the next order records its own graphs.
"""

from __future__ import annotations

import torch

from engine.attention import SeatKV, additive_bias
from engine.kv_pool import SeatBatch, SeatPool
from engine.model import Transformer


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


def try_record(step, dev) -> tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None, str | None]:
    """`record`, but a failed capture returns (None, None, one-line reason) instead of raising.

    The warm-up runs only write the cache slot the first real step overwrites, so an aborted
    capture leaves no state behind; the device is synchronised so a pending error surfaces here,
    not in the next request. The caller runs `step()` eagerly instead.
    """
    try:
        graph, out = record(step, dev)
        return graph, out, None
    except Exception as err:  # capture invalidated, out of memory, an op that cannot be captured
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]  # one line
        if torch.device(dev).type == "cuda":
            try:
                torch.cuda.synchronize(dev)
            except Exception:  # an error that was already reported above; the eager step will tell
                pass
        return None, None, reason


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
    A bucket whose capture failed is remembered in `failed` (bucket -> one-line reason) and its steps
    take the runner's ordinary eager path from then on, so no later step replays a broken graph.
    """

    def __init__(self, model: Transformer, pool: SeatPool, capture: bool | None = None, decode=None):
        """`decode`: an engine.compiled.CompiledDecode whose step the graphs record instead of the eager one."""
        self.model, self.pool, self.decode = model, pool, decode
        self.capture = pool.device.type == "cuda" if capture is None else capture
        self.sizes = buckets(pool.seats)
        self.steps: dict[int, _BucketStep] = {}
        self.failed: dict[int, str] = {}

    def fits(self, batch: int) -> bool:
        """Whether a step of `batch` rows replays a graph; records its bucket's graph on first use."""
        if not (0 < batch and self.bucket(batch) <= self.pool.seats):
            return False
        b = self.bucket(batch)
        if b not in self.steps and b not in self.failed:
            self.pool.prepare_read(list(range(b)), [0] * b, self.pool.seat_len)
            step = _BucketStep(self.model, self.pool, b, self.capture, self.decode)
            if step.failure:
                self.failed[b] = step.failure
            else:
                self.steps[b] = step
        return b in self.steps

    def bucket(self, batch: int) -> int:
        return next(b for b in self.sizes if b >= batch)

    def replay(self, seats: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Logits (B, V) of one decode step whose rows sit in `seats` == 0..B-1."""
        assert seats == list(range(len(seats))), "decode rows must be compacted into seats 0..B-1"
        assert self.fits(len(seats)), "replay only a batch that fits() said a graph serves"
        return self.steps[self.bucket(len(seats))](tokens, positions)[: len(seats)]


class _BucketStep:
    def __init__(self, model: Transformer, pool: SeatPool, b: int, capture: bool, decode=None):
        dev, width = pool.device, pool.seat_len
        self.tokens = torch.zeros(b, 1, dtype=torch.long, device=dev)  # (b, 1)
        self.positions = torch.zeros(b, 1, dtype=torch.long, device=dev)  # (b, 1)
        self.index = torch.zeros(b * pool.cfg.n_kv_heads, dtype=torch.long, device=dev)  # (b * Hkv,)
        self.valid = torch.zeros(b, width, dtype=torch.bool, device=dev)  # (b, W)
        self.bias = torch.zeros(b, 1, 1, width, dtype=model.dtype, device=dev)  # (b, 1, 1, W)
        self.b, self.width, self.pool = b, width, pool
        kv = SeatKV(SeatBatch(self.index, 0, width, self.bias, [], b), pool)
        rows = torch.arange(b, device=dev)

        def step() -> torch.Tensor:
            if decode is not None:  # compiled: the warm-ups before the capture compile it
                return decode(self.tokens, self.positions, kv.sb, pool).view(b, -1)  # (b, V)
            return model(self.tokens, self.positions, kv, rows)

        self.step, self.graph, self.failure = step, None, None
        # Recording runs the step for real (warm-ups): aim every row at its seat's last slot, which no
        # sequence reads before writing it itself. Position 0 would overwrite live prompts' K/V.
        self._fill([0] * b, [width - 1] * b)
        if capture:  # logits (b, V): a static output buffer; on failure this bucket runs eagerly
            self.graph, self.logits, self.failure = try_record(step, dev)

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
