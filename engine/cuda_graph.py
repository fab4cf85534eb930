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
from engine.model import Transformer


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
        from engine.engine import decode_one_token  # one definition of the decode step, eager or graphed

        B, dev = valid.shape[0], valid.device
        self.tokens = torch.zeros(B, 1, dtype=torch.long, device=dev)  # (B, 1)
        self.positions = torch.zeros(B, 1, dtype=torch.long, device=dev)  # (B, 1)
        # Warm-up runs really execute: point them at the slot the first real step overwrites anyway.
        self.input_pos = torch.full((1,), first_slot, dtype=torch.long, device=dev)  # (1,)
        mask = valid[:, None, None, :]  # (B, 1, 1, S): a view, so flipping `valid` updates it

        def step() -> torch.Tensor:
            return decode_one_token(model, self.tokens, self.positions, self.input_pos, mask, cache)

        self.step, self.graph = step, None
        if not capture:
            return
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):  # lets cuBLAS / SDPA pick and allocate their workspaces
                step()
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = step()  # (B, V), a static output buffer

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slot: int) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.input_pos.fill_(slot)
        if self.graph is None:
            return self.step()
        self.graph.replay()
        return self.logits
