"""Attention: grouped-query attention with ONE forward; where K/V live is an argument.

`Attention.forward(x, rope, kv)` projects q, k, v, hands them to `kv.attend(layer, q, k, v)`, and
projects the heads back. `kv` is a KV view (the `KVView` protocol): it writes this pass's K/V
where they belong, reads what the queries may see, and runs the attention core:
  SeatKV    one serving pass over many sequences' KV seats (engine/kv_pool.py, engine/runner.py)
  BatchKV   a fixed batch: padded or packed prefill, or one decode token, over seats 0..B-1
            or none (attend only within this pass); the lab's kitchens drive it (lab/kitchens.py)
The cores are plain functions the views share: `decode_attention` (one new token per sequence),
`packed_attention` (sequences concatenated in one row) and SDPA.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.invariance import GridCall, attend_on_grid
from engine.kv_pool import SeatBatch, SeatPool
from engine.layers import Rope, add_buffer, add_weight, apply_rope
from engine.quant import matmul


class KVView(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, H, T, D), this pass's k and v (B, Hkv, T, D) -> attention output (B, T, H*D)."""
        ...


def decode_attention(q, k, v, bias: torch.Tensor) -> torch.Tensor:
    """One new query per sequence against its cached keys, as two small matmuls.

    q (B, H, 1, D); k, v (B, Hkv, S, D); bias (B, 1, 1, S) additive: 0 = may attend, -inf = not.
    The H query heads are regrouped as (Hkv, G) so each KV head serves its G query heads in one
    matmul (grouped-query attention without copying K/V G times). On CPU this beats SDPA with the
    same mask at large batch and costs a little at batch 1 (docs/benchmarks/engine-choices.md).
    Worked shapes, SmolLM2-135M at 128 cached tokens: q (1, 9, 1, 64) -> (1, 3, 3, 64);
    scores (1, 3, 3, 128); out (1, 3, 3, 64) -> (1, 1, 576).
    """
    B, H, _, D = q.shape
    q = q.reshape(B, k.shape[1], H // k.shape[1], D)  # (B, Hkv, G, D): a view for one token
    scores = (q @ k.transpose(-2, -1)).mul_(D**-0.5).add_(bias)  # (B, Hkv, G, S)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    # Straight to (B, 1, H*D) with plain contiguous strides. Going through (B, H, 1, D).transpose
    # gives a (B, 1, H*D) view whose size-1 dim has an odd stride, and then `x @ W` cannot fold the
    # batch into one GEMM: it runs B GEMVs that each read all of W.
    return (probs @ v).view(B, 1, H * D)  # (B, Hkv, G, D) -> (B, 1, H*D)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, device, dtype):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        qkv = cfg.q_dim + 2 * cfg.kv_dim
        add_weight(self, "wqkv_t", cfg.d_model, qkv, device, dtype)
        add_buffer(self, "bqkv", (qkv,), device, dtype, cfg.qkv_bias)
        add_weight(self, "wo_t", cfg.q_dim, cfg.d_model, device, dtype)
        add_buffer(self, "bo", (cfg.d_model,), device, dtype, cfg.out_bias)

    def qkv(self, x, rope: Rope | None):
        """Project and rotate: x (B, T, d) -> q (B, H, T, D), k and v (B, Hkv, T, D)."""
        cfg = self.cfg
        B, T, _ = x.shape
        qkv = matmul(x, self.wqkv_t)  # (B, T, q + 2kv)
        if self.bqkv is not None:
            qkv = qkv + self.bqkv
        qk, v = qkv.split([cfg.q_dim + cfg.kv_dim, cfg.kv_dim], dim=-1)
        qk = qk.view(B, T, cfg.n_heads + cfg.n_kv_heads, cfg.head_dim)  # (B, T, H + Hkv, D)
        if rope is not None:
            qk = apply_rope(qk, rope)  # q and k heads sit side by side: one rotation covers both
        q, k = qk.split([cfg.n_heads, cfg.n_kv_heads], dim=2)
        v = v.view(B, T, cfg.n_kv_heads, cfg.head_dim)  # (B, T, Hkv, D)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)

    def forward(self, x, rope: Rope | None, kv: KVView) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d). `kv` says where this pass's K/V are written and read."""
        q, k, v = self.qkv(x, rope)
        out = matmul(kv.attend(self.layer, q, k, v), self.wo_t)  # (B, T, H*D) @ (H*D, d)
        return out + self.bo if self.bo is not None else out


def _heads_to_width(out: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B, T, H*D): the heads side by side, as the out projection reads them."""
    B, H, T, D = out.shape
    return out.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)


def causal(q, k, v, mask: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA over q (B, H, T, D) and k, v (B, Hkv, S, D): `mask` (B, 1, T, S) bool, or None = causal
    within these T tokens. -> (B, H, T, D)."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None and q.shape[2] > 1, enable_gqa=q.shape[1] != k.shape[1]
    )


@dataclass(frozen=True)
class SeatKV:
    """One serving pass over many sequences' KV seats: decode rows first, then prefill spans.

    Every token's K/V go to its own sequence's seat at its own position. Decode rows attend
    together (one view of their seats); each span attends to its seat's cache up to itself.
    The pass is (1, N, d), so the GEMMs around attention see all N tokens at once (one read of the
    weights per step); or (B, 1, d) when every row decodes; or (B, T, d) for B whole prompts of one
    length (`sb.uniform`).
    """

    sb: SeatBatch
    pool: SeatPool
    grid: list[GridCall] | None = None  # batch-invariant mode: the step's calls on the key grid

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        sb, pool, nd = self.sb, self.pool, self.sb.n_decode
        if self.grid is not None:  # batch-invariant mode: every query on the key grid
            return attend_on_grid(layer, q, k, v, sb, pool, self.grid)
        if sb.uniform:  # B whole prompts of one length: one batched causal pass
            pool.write_block(layer, k, v)
            return _heads_to_width(causal(q, k, v))  # (B, T, H*D)
        if not sb.spans:  # q (B, H, 1, D), k and v (B, Hkv, 1, D)
            pool.write_rows(layer, sb.decode_index, k[:, :, 0], v[:, :, 0])
            keys, values = pool.read_rows(layer, sb.decode_first, nd, sb.decode_width)  # (B, Hkv, W, D)
            return decode_attention(q, keys, values, sb.decode_bias)  # (B, 1, H*D)
        H, D = q.shape[1], q.shape[3]  # q (1, H, N, D), k and v (1, Hkv, N, D)
        outs = []
        if nd:
            kd, vd = k[0, :, :nd].transpose(0, 1), v[0, :, :nd].transpose(0, 1)  # (Bd, Hkv, D)
            pool.write_rows(layer, sb.decode_index, kd, vd)
            keys, values = pool.read_rows(layer, sb.decode_first, nd, sb.decode_width)  # (Bd, Hkv, W, D)
            qd = q[0, :, :nd].transpose(0, 1).unsqueeze(2)  # (Bd, H, 1, D)
            outs.append(decode_attention(qd, keys, values, sb.decode_bias).view(1, nd, H * D))  # (1, Bd, H*D)
        offset = nd
        for sp in sb.spans:
            s = slice(offset, offset + sp.length)
            pool.write_span(layer, sp.seat, sp.start, k[0, :, s], v[0, :, s])
            if sp.start == 0:  # the span is the whole cache so far: attend within it
                keys, values = k[:, :, s], v[:, :, s]  # (1, Hkv, T, D)
            else:
                keys, values = pool.read_rows(layer, sp.seat, 1, sp.start + sp.length)  # (1, Hkv, S, D)
            outs.append(_heads_to_width(causal(q[:, :, s], keys, values, sp.mask)))  # (1, T, H*D)
            offset += sp.length
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # (1, N, H*D)


@dataclass(frozen=True)
class BatchKV:
    """A fixed batch's pass over seats 0..B-1 of a SeatPool: every row writes the same cache
    *slots* `input_pos` (T,), as a batch laid out by engine/batching.py (padded or packed).

      pool       where K/V are kept (row b in seat b), or None: attend only within this pass
      mask       (B, 1, T, S) bool, True = may attend; S = how many slots to read. None = a fresh
                 causal pass over these T tokens alone (K/V still written to the seats). A
                 one-token pass takes it as an additive float bias instead (`BatchKV.decode`)
      packed     lengths of sequences concatenated in a (1, N) row: attention runs per sequence
                 and each sequence's K/V land in its own seat, so no GEMM does padding work
    """

    pool: SeatPool | None = None
    input_pos: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    packed: list[int] | None = None

    @classmethod
    def decode(cls, pool: SeatPool, input_pos: torch.Tensor, mask: torch.Tensor, dtype) -> BatchKV:
        """One token per row: the bool mask (B, 1, 1, S) becomes the step's additive bias once,
        shared by all layers."""
        return cls(pool, input_pos, additive_bias(mask, dtype))

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        pool, mask = self.pool, self.mask
        if self.packed is not None:  # q (1, H, N, D), k and v (1, Hkv, N, D)
            if pool is not None:
                start = 0
                for seat, n in enumerate(self.packed):
                    pool.write_span(layer, seat, 0, k[0, :, start : start + n], v[0, :, start : start + n])
                    start += n
            return _heads_to_width(packed_attention(q, k, v, self.packed))  # (1, N, H*D)
        if pool is not None:
            B = k.shape[0]
            # index_copy_ with a tensor of slots: no host sync, so it can live inside a CUDA graph.
            pool.k_layer[layer][:B].index_copy_(2, self.input_pos, k)  # (B, Hkv, S, D) <- (B, Hkv, T, D)
            pool.v_layer[layer][:B].index_copy_(2, self.input_pos, v)
            if mask is not None:  # the mask says how many slots this pass reads
                k, v = pool.read_rows(layer, 0, B, mask.shape[-1])  # (B, Hkv, S, D)
        if q.shape[2] == 1 and mask is not None:  # decode: `mask` is the step's additive bias
            return decode_attention(q, k, v, mask)  # (B, 1, H*D)
        return _heads_to_width(causal(q, k, v, mask))  # (B, T, H*D)


FRESH = BatchKV()  # no cache: a causal pass over these tokens alone


def packed_attention(q, k, v, lengths: list[int]) -> torch.Tensor:
    """Causal attention within each packed sequence, q (1, H, N, D), k and v (1, Hkv, N, D).

    Two ways, measured (docs/benchmarks/varlen-cpu.md): one SDPA call per sequence (each does
    exactly its own n x n work; fastest on a quiet CPU), or ONE call over all N tokens with a
    block-diagonal causal mask (`document_mask`), for devices where each call costs a launch
    (CUDA), used only while N^2 is no more than the pairs a padded batch would score.
    """
    n_total, longest = sum(lengths), max(lengths)
    if q.device.type in ONE_CALL_DEVICES and len(lengths) > 1 and n_total**2 <= len(lengths) * longest**2:
        mask = document_mask(tuple(lengths), q.device)  # (N, N) bool, built once per batch shape
        return causal(q, k, v, mask)
    outs, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        outs.append(causal(q[:, :, s], k[:, :, s], v[:, :, s]))  # (1, H, n, D)
        start += n
    return torch.cat(outs, dim=2)  # (1, H, N, D)


ONE_CALL_DEVICES = ("cuda",)  # where packed attention runs as one masked call (see packed_attention)


@functools.lru_cache(maxsize=8)
def document_mask(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """(N, N) bool for packed sequences: token i may attend to j iff both are in the same sequence
    and j <= i. lengths (3, 2) -> N = 5, blocks of 3 and 2 on the diagonal, each lower-triangular."""
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    pos = torch.arange(doc.numel(), device=device)  # (N,)
    return (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])  # (N, N)


def additive_bias(mask: torch.Tensor, dtype) -> torch.Tensor:
    """Bool mask (True = may attend) -> float bias to add to attention scores: 0 or -inf."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
