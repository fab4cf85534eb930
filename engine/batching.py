"""Laying out a batch of different-length prompts for the wok: padded or packed.

Padded (left-pad + mask): prompts of lengths [3, 5] become a (2, 5) block; row 0 gets 2 pad slots
in front. Every GEMM computes all 10 positions, 2 of them wasted. Left padding lines the last real
token of every row up in the same column, so decode can write one common cache slot per step.
  slots      0 1 2 3 4        positions (RoPE / wpe)   mask: a query sees real keys up to itself
  row 0      _ _ a b c        0 0 0 1 2
  row 1      d e f g h        0 1 2 3 4

Packed (no padding work): the same prompts become one (1, 8) row [a b c d e f g h]; GEMMs compute
exactly 8 positions, attention runs per sequence, and each sequence's K/V land in its own cache row
at slots 0..len-1. Row 0's slots 3..4 hold junk that its `valid` mask hides from decode.

Both layouts return a `valid` (B, S) bool map of cache slots that hold real keys; decode flips one
column on per step and attends through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefillBatch:
    tokens: torch.Tensor  # (B, L) padded or (1, N) packed
    positions: torch.Tensor  # same shape as tokens
    input_pos: torch.Tensor | None  # (L,) cache slots written (padded); None when packed
    mask: torch.Tensor | None  # (B, 1, L, L) bool (padded); None when packed or nothing is padded
    logits_rows: torch.Tensor  # (B,) flat index of each sequence's last token
    packed: list[int] | None  # sequence lengths when packed
    lengths: list[int]  # real tokens per sequence
    slots_used: int  # cache slots the prompts occupy; decode continues from here
    valid: torch.Tensor  # (B, S) bool: cache slots holding real keys
    computed: int  # token positions the GEMMs compute, padding included

    @property
    def attn_pairs(self) -> int:
        """Causal (query, key) pairs of real tokens: sum of L (L + 1) / 2."""
        return sum(n * (n + 1) // 2 for n in self.lengths)


def padded_batch(prompts: list[list[int]], device, max_slots: int) -> PrefillBatch:
    lengths = [len(p) for p in prompts]
    B, L = len(prompts), max(lengths)
    pads = torch.tensor([L - n for n in lengths], device=device)  # (B,)
    rows = [[0] * (L - len(p)) + p for p in prompts]  # left-pad with id 0 (masked, never attended)
    tokens = torch.tensor(rows, dtype=torch.long, device=device)  # (B, L): one host-to-device copy
    slots = torch.arange(L, device=device)  # (L,)
    positions = (slots[None, :] - pads[:, None]).clamp(min=0)  # (B, L)
    valid = torch.zeros(B, max(max_slots, L), dtype=torch.bool, device=device)
    valid[:, :L] = slots[None, :] >= pads[:, None]  # (B, L)
    causal = slots[None, :] <= slots[:, None]  # (L, L): key slot <= query slot
    # A pad query sees only itself, so no row of the softmax is empty (its output is never used).
    mask = (causal[None] & valid[:, None, :L]) | torch.eye(L, dtype=torch.bool, device=device)  # (B, L, L)
    no_padding = min(lengths) == L  # then plain causal attention is exact (and a faster kernel)
    return PrefillBatch(
        tokens=tokens,
        positions=positions,
        input_pos=slots,
        mask=None if no_padding else mask[:, None],  # (B, 1, L, L)
        logits_rows=torch.arange(B, device=device) * L + (L - 1),
        packed=None,
        lengths=lengths,
        slots_used=L,
        valid=valid,
        computed=B * L,
    )


def packed_batch(prompts: list[list[int]], device, max_slots: int) -> PrefillBatch:
    lengths = [len(p) for p in prompts]
    L = max(lengths)
    tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=device)[None]  # (1, N)
    positions = torch.tensor([i for n in lengths for i in range(n)], device=device)[None]  # (1, N)
    ends = torch.tensor(lengths, device=device).cumsum(0) - 1  # (B,) last token of each sequence
    width = max(max_slots, L)
    valid = (
        torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    )  # (B, S)
    return PrefillBatch(
        tokens=tokens,
        positions=positions,
        input_pos=None,
        mask=None,
        logits_rows=ends,
        packed=lengths,
        lengths=lengths,
        slots_used=L,
        valid=valid,
        computed=sum(lengths),
    )


def build_batch(prompts: list[list[int]], batching: str, device, max_slots: int = 0) -> PrefillBatch:
    make = packed_batch if batching == "packed" else padded_batch
    return make(prompts, device, max_slots)
