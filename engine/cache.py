"""The KV cache: the serving counter between the wok (prefill) and the soup pot (decode).

Prefill computes K and V for every prompt token in one pass and leaves them here; each decode step
adds one more K/V column per sequence and reads everything before it. Without this counter the pot
would have to re-cook the whole meal for every spoonful (that is cache mode `none`).

One contract for every cache: `update(layer, input_pos, k, v) -> (k_all, v_all)` writes this
pass's K/V (shape `(B, Hkv, T, D)`) into cache *slots* `input_pos` (common to the batch) and returns
the layer's keys/values so far. Two implementations, same tokens:

  StaticKVCache   preallocates `(B, Hkv, S, D)` per layer once, writes in place (what fast engines do)
  GrowingKVCache  torch.cat's each step's column onto the end (simple, but copies the whole cache
                  every step: quadratic traffic the lab can show)

Packed prefill hands over K/V for all prompts concatenated in one row; `write_packed` scatters each
sequence into its own batch row. `keep_rows` drops finished sequences (compaction) so decode stops
paying for them.
"""

from __future__ import annotations

import torch


class KVCache:
    """Shared bookkeeping: shapes, live bytes, and the per-layer K/V lists."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.n_layers, self.batch, self.n_kv_heads, self.head_dim = n_layers, batch, n_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.live = [0] * batch  # real tokens each row holds (padding and junk slots excluded)

    def add_live(self, counts: list[int]) -> None:
        """Record that each row now holds `counts[row]` more real tokens (the engine knows which)."""
        self.live = [n + c for n, c in zip(self.live, counts, strict=True)]

    @property
    def bytes_in_use(self) -> int:
        """Bytes of K/V that hold real tokens: what the serving counter really carries."""
        return sum(self.live) * self.bytes_per_token

    @property
    def bytes_per_token(self) -> int:
        """One cached token of one sequence: K and V, every layer."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8

    @property
    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        raise NotImplementedError

    def write_packed(self, layer: int, lengths: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        raise NotImplementedError

    def keep_rows(self, rows: list[int]) -> None:
        """Compaction: keep only batch rows `rows`, in that order (copies the kept rows once)."""
        idx = torch.tensor(rows, device=self.device)
        self.k = [t.index_select(0, idx) for t in self.k]
        self.v = [t.index_select(0, idx) for t in self.v]
        self.live = [self.live[r] for r in rows]
        self.batch = len(rows)


def _scatter_packed(dst: torch.Tensor, lengths: list[int], src: torch.Tensor) -> None:
    """Copy packed K or V `(1, Hkv, N, D)` into rows of `dst` `(B, Hkv, S, D)`, slots 0..len-1."""
    start = 0
    for row, n in enumerate(lengths):
        dst[row, :, :n].copy_(src[0, :, start : start + n])
        start += n


class StaticKVCache(KVCache):
    """Preallocated `(B, Hkv, S, D)` per layer; writes go in place at `input_pos`.

    The returned tensors are the whole allocation: the caller slices to the slots it attends to
    (the width of its mask), so a decode step reads only the filled prefix, never the empty tail.
    """

    def __init__(self, n_layers, batch, n_kv_heads, head_dim, max_slots: int, dtype, device):
        super().__init__(n_layers, batch, n_kv_heads, head_dim, dtype, device)
        self.max_slots = max_slots
        shape = (batch, n_kv_heads, max_slots, head_dim)  # (B, Hkv, S, D)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]

    def update(self, layer, input_pos, k, v):
        # index_copy_ with a tensor of slots: no host sync, so it can live inside a CUDA graph.
        self.k[layer].index_copy_(2, input_pos, k)
        self.v[layer].index_copy_(2, input_pos, v)
        return self.k[layer], self.v[layer]

    def write_packed(self, layer, lengths, k, v):
        _scatter_packed(self.k[layer], lengths, k)
        _scatter_packed(self.v[layer], lengths, v)


class GrowingKVCache(KVCache):
    """Starts empty and concatenates each pass's K/V onto the end: every step copies the cache."""

    def __init__(self, n_layers, batch, n_kv_heads, head_dim, dtype, device):
        super().__init__(n_layers, batch, n_kv_heads, head_dim, dtype, device)
        self.k = [None] * n_layers  # type: ignore[list-item]
        self.v = [None] * n_layers  # type: ignore[list-item]
        self.peak_bytes = 0

    @property
    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    def update(self, layer, input_pos, k, v):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k.contiguous(), v.contiguous()
        else:
            # Slots must arrive in order: the new column goes at the end.
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)  # (B, Hkv, S+T, D)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        self.peak_bytes = max(self.peak_bytes, self.bytes_allocated)
        return self.k[layer], self.v[layer]

    def write_packed(self, layer, lengths, k, v):
        shape = (len(lengths), self.n_kv_heads, max(lengths), self.head_dim)  # (B, Hkv, Lmax, D)
        self.k[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
        self.v[layer] = torch.zeros(shape, dtype=v.dtype, device=v.device)
        _scatter_packed(self.k[layer], lengths, k)
        _scatter_packed(self.v[layer], lengths, v)
        self.peak_bytes = max(self.peak_bytes, self.bytes_allocated)
