"""Our transformer: one module that runs Llama / SmolLM2 / Mistral, Qwen2 and GPT-2 shaped models.

Written for reading and for decode speed (gpt-fast style), not for training:

* Every weight is used as `(in, out)` so a layer computes `x @ W_t`. In float32 it is stored that
  way (pre-transposed): for the one-row GEMVs of decode this beat `F.linear(x, W)` on our CPU. In
  bf16/fp16 on CPU the memory underneath stays `(out, in)` and `W_t` is a transposed view, which
  those kernels prefer (`_weight` has the measurements).
* q/k/v live in one fused `(d, q + 2 kv)` matrix and gate/up in one `(d, 2 ffn)` matrix, so a layer
  is four GEMMs: qkv, out, gate_up, down.
* Tied embeddings keep ONE `(d, V)` matrix: the LM head multiplies by it, and embedding a token
  gathers its column. No second 113 MB copy for SmolLM2.
* RoPE cos/sin tables are computed once for the whole context; a pass just gathers its rows.
* Every weight product goes through `engine.quant.matmul`, so `quant="int8"` can swap a weight for
  an int8 one (engine/quant.py) without touching the code below.

`forward(tokens, positions, input_pos, mask, cache, logits_rows, packed)` keeps the data flow
explicit:
  tokens     (B, T) ids
  positions  (B, T) per-row position of each token (RoPE angle or GPT-2 wpe row); with left padding
             a row's first real token is position 0 even if it sits in slot 5
  input_pos  (T,) cache *slots* this pass writes, common to the whole batch
  mask       (B, 1, T, S) bool, True = may attend; S = how many cache slots to read. None = a
             fresh causal pass over these T tokens alone (K/V still written to the cache). A
             one-token pass turns it into an additive float bias once, shared by all layers
  cache      a KVCache or None (None: attend only within this pass, e.g. recompute mode)
  packed     lengths of sequences concatenated in a (1, N) row: attention runs per sequence and
             K/V are scattered into cache rows, so no GEMM does padding work
  logits_rows  flat row indices (into B*T) that need logits; prefill asks only for each sequence's
             last position, because the LM head is the biggest GEMM per token
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.cache import KVCache
from engine.config import ModelConfig, rope_inv_freq
from engine.kv_pool import SeatBatch, SeatPool
from engine.quant import matmul


@dataclass(frozen=True)
class Rope:
    cos: torch.Tensor  # (B, T, 1, D): broadcast over heads
    sin: torch.Tensor


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate each (i, i + D/2) pair of dims by angle position * inv_freq[i]. x: (B, T, H, D).

    HF writes it x cos + rotate_half(x) sin with rotate_half(x1, x2) = (-x2, x1). Our sin table
    already carries that minus sign on its first half, so the rotation is just a swap of halves:
    one op fewer per layer on the decode hot path, same numbers.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * rope.cos, torch.cat((x2, x1), dim=-1), rope.sin)  # x cos + rot(x) sin


def activation(name: str):
    if name == "silu":
        return F.silu
    if name == "gelu":
        return F.gelu
    return lambda x: F.gelu(x, approximate="tanh")  # gelu_new / gelu_pytorch_tanh


class Norm(nn.Module):
    """RMSNorm (Llama, Qwen2; computed in float32 like HF) or LayerNorm with bias (GPT-2)."""

    def __init__(self, cfg: ModelConfig, device, dtype):
        super().__init__()
        self.kind, self.eps, self.d = cfg.norm, cfg.norm_eps, cfg.d_model
        self.register_buffer("weight", torch.empty(cfg.d_model, device=device, dtype=dtype))
        bias = torch.empty(cfg.d_model, device=device, dtype=dtype) if cfg.norm == "layer" else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layer":
            return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, with the statistics in float32 as HF computes them.

    Written out rather than `F.rms_norm`, which was slower on CPU for prefill-sized activations and
    no faster for one decode row (docs/benchmarks/engine-choices.md). Half and bfloat16 inputs take
    HF's round trip through float32.
    """
    if x.dtype == torch.float32:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


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


def _buffer(module: nn.Module, name: str, shape, device, dtype, present: bool = True) -> None:
    module.register_buffer(name, torch.empty(shape, device=device, dtype=dtype) if present else None)


def _weight(module: nn.Module, name: str, d_in: int, d_out: int, device, dtype) -> None:
    """A weight used as `x @ W_t`, shape (d_in, d_out); which way round its memory lies depends on dtype.

    float32 keeps (in, out) rows contiguous: MKL's fp32 GEMV is fastest that way on CPU.
    16-bit weights on CPU are stored (out, in), HF's layout, and `W_t` is a transposed view of
    it: the bf16/fp16 kernels (oneDNN) want that (docs/benchmarks/engine-choices.md has both
    measurements). Same values either way; loaders just copy_ in.
    """
    half_on_cpu = dtype in (torch.bfloat16, torch.float16) and torch.device(device).type == "cpu"
    if half_on_cpu:
        module.register_buffer(name, torch.empty(d_out, d_in, device=device, dtype=dtype).t())  # view
    else:
        module.register_buffer(name, torch.empty(d_in, d_out, device=device, dtype=dtype))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, device, dtype):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        qkv = cfg.q_dim + 2 * cfg.kv_dim
        _weight(self, "wqkv_t", cfg.d_model, qkv, device, dtype)
        _buffer(self, "bqkv", (qkv,), device, dtype, cfg.qkv_bias)
        _weight(self, "wo_t", cfg.q_dim, cfg.d_model, device, dtype)
        _buffer(self, "bo", (cfg.d_model,), device, dtype, cfg.out_bias)

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

    def forward(self, x, rope: Rope | None, input_pos, mask, cache: KVCache | None, packed):
        cfg = self.cfg
        B, T, _ = x.shape
        q, k, v = self.qkv(x, rope)
        if packed is not None:
            out = self._packed_attention(q, k, v, packed)
            if cache is not None:
                cache.write_packed(self.layer, packed, k, v)
        else:
            if cache is not None and mask is None:
                cache.update(self.layer, input_pos, k, v)  # fresh causal pass: write, attend within it
            elif cache is not None:
                k, v = cache.update(self.layer, input_pos, k, v)
                slots = mask.shape[-1]  # the mask says how much of the cache this pass reads
                k, v = k[:, :, :slots], v[:, :, :slots]  # (B, Hkv, S, D)
            if T == 1 and mask is not None:  # decode: `mask` is the step's additive bias
                return self._project(decode_attention(q, k, v, mask))  # (B, 1, H*D)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and T > 1, enable_gqa=cfg.group > 1
            )  # (B, H, T, D)
        return self._project(out.transpose(1, 2).reshape(B, T, cfg.q_dim))  # (B, T, H*D)

    def forward_seats(self, x, rope: Rope | None, sb: SeatBatch, pool: SeatPool) -> torch.Tensor:
        """One serving pass over many sequences' tokens: decode rows first, then prefill spans.

        Every token's K/V go to its own sequence's seat at its own position. Decode rows attend
        together (one view of their seats); each span attends to its seat's cache up to itself.
        x is (1, N, d), so the GEMMs around this see all N tokens at once (one read of the weights
        per step), or (B, 1, d) when every row decodes: then this is the decode path exactly.
        """
        cfg, layer, nd = self.cfg, self.layer, sb.n_decode
        q, k, v = self.qkv(x, rope)  # (1, H, N, D) and (1, Hkv, N, D), or (B, H, T, D) and (B, Hkv, T, D)
        if sb.uniform:  # B whole prompts of one length: one batched causal pass, like the fixed batch's wok
            pool.write_block(layer, k, v)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, enable_gqa=cfg.group > 1)
            return self._project(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], cfg.q_dim))  # (B, T, d)
        if not sb.spans:
            pool.write_rows(layer, sb.decode_index, k[:, :, 0], v[:, :, 0])
            keys, values = pool.read_rows(layer, sb.decode_first, nd, sb.decode_width)  # (B, Hkv, W, D)
            return self._project(decode_attention(q, keys, values, sb.decode_bias))  # (B, 1, d)
        outs = []
        if nd:
            kd, vd = k[0, :, :nd].transpose(0, 1), v[0, :, :nd].transpose(0, 1)  # (Bd, Hkv, D)
            pool.write_rows(layer, sb.decode_index, kd, vd)
            keys, values = pool.read_rows(layer, sb.decode_first, nd, sb.decode_width)  # (Bd, Hkv, W, D)
            qd = q[0, :, :nd].transpose(0, 1).unsqueeze(2)  # (Bd, H, 1, D)
            outs.append(decode_attention(qd, keys, values, sb.decode_bias).view(1, nd, cfg.q_dim))
        offset = nd
        for sp in sb.spans:
            s = slice(offset, offset + sp.length)
            pool.write_span(layer, sp.seat, sp.start, k[0, :, s], v[0, :, s])
            if sp.start == 0:  # the span is the whole cache so far: attend within it
                keys, values = k[:, :, s], v[:, :, s]  # (1, Hkv, T, D)
            else:
                keys, values = pool.read_rows(layer, sp.seat, 1, sp.start + sp.length)  # (1, Hkv, S, D)
            out = F.scaled_dot_product_attention(
                q[:, :, s], keys, values, attn_mask=sp.mask,
                is_causal=sp.mask is None and sp.length > 1, enable_gqa=cfg.group > 1,
            )  # fmt: skip  # (1, H, T, D)
            outs.append(out.transpose(1, 2).reshape(1, sp.length, cfg.q_dim))
            offset += sp.length
        return self._project(outs[0] if len(outs) == 1 else torch.cat(outs, dim=1))  # (1, N, d)

    def _project(self, out: torch.Tensor) -> torch.Tensor:
        """Heads back to the model width: (B, T, H*D) @ (H*D, d)."""
        out = matmul(out, self.wo_t)
        return out + self.bo if self.bo is not None else out

    def _packed_attention(self, q, k, v, lengths: list[int]) -> torch.Tensor:
        """Causal attention within each packed sequence, q (1, H, N, D), k and v (1, Hkv, N, D).

        Two ways, measured (docs/benchmarks/varlen-cpu.md): one SDPA call per sequence (each does
        exactly its own n x n work; fastest on a quiet CPU), or ONE call over all N tokens with a
        block-diagonal causal mask (`document_mask`), for devices where each call costs a launch
        (CUDA), used only while N^2 is no more than the pairs a padded batch would score.
        """
        n_total, longest = sum(lengths), max(lengths)
        if q.device.type in ONE_CALL_DEVICES and len(lengths) > 1 and n_total**2 <= len(lengths) * longest**2:
            mask = document_mask(tuple(lengths), q.device)  # (N, N) bool, built once per batch shape
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.cfg.group > 1)
        outs, start = [], 0
        for n in lengths:
            s = slice(start, start + n)
            outs.append(
                F.scaled_dot_product_attention(
                    q[:, :, s], k[:, :, s], v[:, :, s], is_causal=n > 1, enable_gqa=self.cfg.group > 1
                )
            )
            start += n
        return torch.cat(outs, dim=2)  # (1, H, N, D)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, device, dtype):
        super().__init__()
        self.cfg, self.act = cfg, activation(cfg.act)
        up = 2 * cfg.ffn_dim if cfg.mlp_gated else cfg.ffn_dim
        _weight(self, "w_up_t", cfg.d_model, up, device, dtype)  # gate and up fused when gated
        _buffer(self, "b_up", (up,), device, dtype, cfg.out_bias)
        _weight(self, "w_down_t", cfg.ffn_dim, cfg.d_model, device, dtype)
        _buffer(self, "b_down", (cfg.d_model,), device, dtype, cfg.out_bias)

    def forward(self, x):
        h = matmul(x, self.w_up_t)  # (B, T, 2F) or (B, T, F)
        if self.b_up is not None:
            h = h + self.b_up
        if self.cfg.mlp_gated:
            gate, up = h.split(self.cfg.ffn_dim, dim=-1)
            h = self.act(gate).mul_(up)  # SwiGLU, in place: prefill's (T, ffn) tensors are big
        else:
            h = self.act(h)
        out = matmul(h, self.w_down_t)
        return out + self.b_down if self.b_down is not None else out


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer: int, device, dtype):
        super().__init__()
        self.attn_norm, self.mlp_norm = Norm(cfg, device, dtype), Norm(cfg, device, dtype)
        self.attn, self.mlp = Attention(cfg, layer, device, dtype), MLP(cfg, device, dtype)

    def forward(self, x, rope, input_pos, mask, cache, packed):
        x = x + self.attn(self.attn_norm(x), rope, input_pos, mask, cache, packed)
        return x + self.mlp(self.mlp_norm(x))

    def forward_seats(self, x, rope, sb: SeatBatch, pool: SeatPool):
        x = x + self.attn.forward_seats(self.attn_norm(x), rope, sb, pool)
        return x + self.mlp(self.mlp_norm(x))


ONE_CALL_DEVICES = ("cuda",)  # where packed attention runs as one masked call (see _packed_attention)


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


class Transformer(nn.Module):
    """Allocates uninitialised weights of `cfg`'s shape; loader.py or presets.py fills them."""

    def __init__(self, cfg: ModelConfig, device="cpu", dtype=torch.float32):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Block(cfg, i, device, dtype) for i in range(cfg.n_layers))
        self.final_norm = Norm(cfg, device, dtype)
        _weight(self, "lm_head_t", cfg.d_model, cfg.vocab_size, device, dtype)  # (d, V)
        _buffer(self, "embed", (cfg.vocab_size, cfg.d_model), device, dtype, not cfg.tied)
        _buffer(self, "wpe", (cfg.max_context, cfg.d_model), device, dtype, cfg.positions == "learned")
        if cfg.positions == "rope":
            angles = torch.outer(torch.arange(cfg.max_context, dtype=torch.float64), rope_inv_freq(cfg))
            angles = torch.cat([angles, angles], dim=-1)  # (ctx, D): both halves of each pair
            sin = angles.sin()
            sin[:, : sin.shape[1] // 2].neg_()  # rotate_half's minus sign, folded in (see apply_rope)
            self.register_buffer("rope_cos", angles.cos().to(device=device, dtype=dtype))
            self.register_buffer("rope_sin", sin.to(device=device, dtype=dtype))

    @property
    def device(self) -> torch.device:
        return self.final_norm.weight.device  # not the LM head: it may be an int8 module (engine/quant.py)

    @property
    def dtype(self) -> torch.dtype:
        return self.final_norm.weight.dtype  # the activations' dtype, int8 weights or not

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        if self.embed is not None:
            return self.embed[tokens]  # (B, T, d)
        # Tied: token i's embedding is column i of the LM head matrix (row i of its (V, d) view).
        table = self.lm_head_t.t()  # (V, d)
        if table.is_contiguous():  # 16-bit CPU layout (see _weight): rows are contiguous already
            return table[tokens]  # (B, T, d)
        # float32: gather columns -> (d, B*T). The transpose must be made contiguous: elementwise
        # ops keep a column-major layout all the way through the network, and `x @ W` on such an
        # x cannot fold (B, T) into one GEMM: it runs B GEMVs, each reading all of W. Advanced
        # indexing, not index_select: it gathers cold columns several times faster
        # (docs/benchmarks/engine-choices.md).
        cols = self.lm_head_t[:, tokens.reshape(-1)]  # (d, B*T)
        return cols.t().contiguous().view(B, T, -1)  # (B, T, d)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        input_pos: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        logits_rows: torch.Tensor | None = None,
        packed: list[int] | None = None,
    ) -> torch.Tensor:
        """Logits `(B, T, V)`, or `(R, V)` for the flat rows in `logits_rows`."""
        x, rope = self._inputs(tokens, positions)
        if tokens.shape[1] == 1 and mask is not None:
            mask = additive_bias(mask, x.dtype)  # once per step, not once per layer
        for block in self.layers:
            x = block(x, rope, input_pos, mask, cache, packed)
        return self._logits(x, logits_rows)

    def forward_seats(
        self, tokens: torch.Tensor, positions: torch.Tensor, sb: SeatBatch, pool: SeatPool,
        logits_rows: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """One serving step: tokens and positions (1, N) of many sequences -> logits (R, V) of the
        flat rows `logits_rows`; or (B, 1) when every row decodes -> (B, 1, V) (`logits_rows` None)."""
        x, rope = self._inputs(tokens, positions)
        for block in self.layers:
            x = block.forward_seats(x, rope, sb, pool)
        return self._logits(x, logits_rows)

    def _inputs(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Rope | None]:
        x = self.embed_tokens(tokens)  # (B, T, d)
        if self.cfg.positions == "learned":
            return x + self.wpe[positions], None
        return x, Rope(self.rope_cos[positions].unsqueeze(2), self.rope_sin[positions].unsqueeze(2))

    def _logits(self, x: torch.Tensor, logits_rows: torch.Tensor | None) -> torch.Tensor:
        if logits_rows is not None:
            x = x.reshape(-1, x.shape[-1]).index_select(0, logits_rows)  # (R, d)
        return matmul(self.final_norm(x), self.lm_head_t)  # (..., V)


def prefill(model: Transformer, batch, cache: KVCache | None) -> torch.Tensor:
    """The wok: all prompt tokens of all sequences in one pass. Returns (B, V) last-token logits.

    `batch` is an engine.batching.PrefillBatch (padded or packed)."""
    return model(
        batch.tokens, batch.positions, batch.input_pos, batch.mask, cache, batch.logits_rows, batch.packed
    )


def decode_one_token(model: Transformer, tokens, positions, input_pos, mask, cache: KVCache) -> torch.Tensor:
    """The soup pot: one token per sequence (B, 1) at cache slot input_pos (1,). Returns (B, V)."""
    return model(tokens, positions, input_pos, mask, cache)[:, -1]
