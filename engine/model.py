"""Our transformer: one module that runs Llama / SmolLM2 / Mistral, Qwen2 and GPT-2 shaped models.

Written for reading and for decode speed (gpt-fast style), not for training:

* Every weight is used as `(in, out)` so a layer computes `x @ W_t`. In float32 it is stored that
  way (pre-transposed): for the one-row GEMVs of decode this beat `F.linear(x, W)` on our CPU. In
  bf16/fp16 on CPU the memory underneath stays `(out, in)` and `W_t` is a transposed view, which
  those kernels prefer (`add_weight` in engine/layers.py has the measurements).
* q/k/v live in one fused `(d, q + 2 kv)` matrix and gate/up in one `(d, 2 ffn)` matrix, so a layer
  is four GEMMs: qkv, out, gate_up, down.
* Tied embeddings keep ONE `(d, V)` matrix: the LM head multiplies by it, and embedding a token
  gathers its column. No second 113 MB copy for SmolLM2.
* RoPE cos/sin tables are computed once for the whole context; a pass just gathers its rows.
* Every weight product goes through `engine.quant.matmul`, so `quant="int8"` can swap a weight for
  an int8 one (engine/quant.py) without touching the code below.

`forward(tokens, positions, kv, logits_rows)` is the one forward of every kitchen, with the data
flow explicit:
  tokens       (B, T) ids: (B, 1) a decode step, (1, N) a packed or serving pass of many sequences
  positions    (B, T) per-row position of each token (RoPE angle or GPT-2 wpe row); with left
               padding a row's first real token is position 0 even if it sits in slot 5
  kv           where K/V are written and read (engine/attention.py): `SeatKV` the serving seats,
               `BatchKV` a fixed batch over seats 0..B-1 or none; None = a fresh causal pass over
               these tokens alone
  logits_rows  flat row indices (into B*T) that need logits; prefill asks only for each sequence's
               last position, because the LM head is the biggest GEMM per token
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention import FRESH, Attention, BatchKV, KVView
from engine.config import ModelConfig, rope_inv_freq
from engine.kv_pool import SeatPool
from engine.layers import Norm, Rope, activation, add_buffer, add_weight
from engine.quant import matmul


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, device, dtype):
        super().__init__()
        self.cfg, self.act = cfg, activation(cfg.act)
        up = 2 * cfg.ffn_dim if cfg.mlp_gated else cfg.ffn_dim
        add_weight(self, "w_up_t", cfg.d_model, up, device, dtype)  # gate and up fused when gated
        add_buffer(self, "b_up", (up,), device, dtype, cfg.out_bias)
        add_weight(self, "w_down_t", cfg.ffn_dim, cfg.d_model, device, dtype)
        add_buffer(self, "b_down", (cfg.d_model,), device, dtype, cfg.out_bias)

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

    def forward(self, x, rope: Rope | None, kv: KVView):
        x = x + self.attn.forward(self.attn_norm(x), rope, kv)  # .forward: see Transformer.forward
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Allocates uninitialised weights of `cfg`'s shape; loader.py or presets.py fills them."""

    def __init__(self, cfg: ModelConfig, device="cpu", dtype=torch.float32):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Block(cfg, i, device, dtype) for i in range(cfg.n_layers))
        self.final_norm = Norm(cfg, device, dtype)
        add_weight(self, "lm_head_t", cfg.d_model, cfg.vocab_size, device, dtype)  # (d, V)
        add_buffer(self, "embed", (cfg.vocab_size, cfg.d_model), device, dtype, not cfg.tied)
        add_buffer(self, "wpe", (cfg.max_context, cfg.d_model), device, dtype, cfg.positions == "learned")
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
        if table.is_contiguous():  # 16-bit CPU layout (see engine/layers.py add_weight): rows are contiguous already
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
        kv: KVView | None = None,
        logits_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits `(B, T, V)`, or `(R, V)` for the flat rows in `logits_rows`."""
        x, rope = self._inputs(tokens, positions)
        kv = FRESH if kv is None else kv
        for block in self.layers:
            # .forward, not block(...): nn.Module.__call__'s hook checks cost ~1.5 us a call, 20 us a
            # chef decode step (~1 % at batch 1), and nothing here registers hooks
            x = block.forward(x, rope, kv)
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


def prefill(model: Transformer, batch, pool: SeatPool | None) -> torch.Tensor:
    """The wok: all prompt tokens of all sequences in one pass. Returns (B, V) last-token logits.

    `batch` is an engine.batching.PrefillBatch (padded or packed); sequence b's K/V go to seat b
    of `pool` (None: kept nowhere). Slots a packed row leaves empty are zeroed first: decode
    reads them behind its mask, and an unwritten CPU page may hold NaN."""
    if pool is not None and batch.packed is not None:
        B = len(batch.packed)
        pool.prepare_read(list(range(B)), [0] * B, pool.seat_len)
    kv = BatchKV(pool, batch.input_pos, batch.mask, batch.packed)
    return model(batch.tokens, batch.positions, kv, batch.logits_rows)


def decode_one_token(model: Transformer, tokens, positions, input_pos, mask, pool: SeatPool) -> torch.Tensor:
    """The soup pot: one token per sequence (B, 1) at cache slot input_pos (1,), reading the cache
    slots `mask` (B, 1, 1, S) allows. Returns (B, V)."""
    return model(tokens, positions, BatchKV.decode(pool, input_pos, mask, model.dtype))[:, -1]
