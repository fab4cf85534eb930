"""Analytic cost of one forward pass: how many FLOPs it must do and how many bytes it must move.

This is the theory the lab draws next to the measurements. It explains the two pots:

* FLOPs grow with the tokens in the pass (each token is multiplied by every weight: 2 FLOPs per
  weight per token), so prefill with hundreds of tokens is a big GEMM: compute-bound, the wok.
* Bytes are dominated by reading every weight once per pass, however many tokens share it, plus
  the KV cache. Decode has one token per sequence, so it does ~2 FLOPs per weight byte read (fp32:
  0.5 FLOP/byte): far below any CPU/GPU ridge point, memory-bound, the soup pot.

Worked example, SmolLM2-135M in float32, one decode step, batch 1, 100 cached tokens:
  matmul weights per layer 3,538,944 x 30 layers = 106,168,320; LM head 576 x 49,152 = 28,311,552
  FLOPs  = 2 x 106.2M + 2 x 28.3M (one logits row) + attention 4 x 30 layers x 9 heads x 64 x 101 keys
         = 212.3M + 56.6M + 7.0M ~ 275.9 MFLOP
  bytes  = (106.2M + 28.3M + 61 norms x 576) weights x 4 B ~ 538 MB
           + KV read 100 x 46,080 B ~ 4.6 MB + KV write 1 x 46,080 B
  intensity ~ 0.5 FLOP/byte: the step takes as long as streaming ~0.54 GB from memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig
from engine.native_ops import blocks


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes_moved: float

    @property
    def intensity(self) -> float:
        """FLOP per byte: the x-axis of the roofline."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0


def weight_bytes(cfg: ModelConfig, dtype_bytes: int, with_lm_head: bool = True, quant: str | None = None) -> int:
    """Weights one pass must read: every layer's matrices, biases and norms, plus the LM head.

    `quant="int8"` (engine/quant.py): every matrix is one byte per weight plus a float16 scale
    per 32 inputs of each output channel (Q8_0's 1.0625 bytes a weight); biases and norms stay at
    `dtype_bytes`. The chef: 4.7 M matrix weights, 18.9 MB in float32, 4.7 MB + 0.3 MB of scales in int8."""
    layer_extras = cfg.num_params() - cfg.n_layers * cfg.layer_matmul_params()
    layer_extras -= cfg.vocab_size * cfg.d_model * (1 if cfg.tied else 2)  # embeddings: gathered, not read
    if cfg.positions == "learned":
        layer_extras -= cfg.max_context * cfg.d_model
    matrices = cfg.n_layers * cfg.layer_matmul_params() + (cfg.vocab_size * cfg.d_model if with_lm_head else 0)
    if quant != "int8":
        return (matrices + layer_extras) * dtype_bytes
    return layer_extras * dtype_bytes + matrices + 2 * scale_count(cfg, with_lm_head)


def scale_count(cfg: ModelConfig, with_lm_head: bool = True) -> int:
    """How many int8 scales the matrices hold: one per 32 inputs (rounded up) of each output channel."""
    up = cfg.ffn_dim * (2 if cfg.mlp_gated else 1)  # gate|up fused, or GPT-2's one fc
    per_layer = (cfg.q_dim + 2 * cfg.kv_dim) * blocks(cfg.d_model) + cfg.d_model * blocks(cfg.q_dim)
    per_layer += up * blocks(cfg.d_model) + cfg.d_model * blocks(cfg.ffn_dim)
    return cfg.n_layers * per_layer + (cfg.vocab_size * blocks(cfg.d_model) if with_lm_head else 0)


def step_cost(
    cfg: ModelConfig,
    batch: int,
    tokens: int,
    kv_tokens: int,
    dtype_bytes: int,
    logits_rows: int,
    attn_pairs: int | None = None,
    quant: str | None = None,
) -> StepCost:
    """FLOPs and bytes of one pass.

    batch        sequences in the pass
    tokens       token positions computed (padding included if the pass computes it)
    kv_tokens    cache positions attended to, summed over the batch (after this pass's writes)
    logits_rows  rows that go through the LM head (prefill: one per sequence; full forward: all)
    attn_pairs   (query, key) pairs scored; default: each token sees kv_tokens / batch keys, which
                 is exact for decode. Prefill passes the causal count (sum of L(L+1)/2).
    quant        "int8": the matrices are read as int8 (see weight_bytes); the FLOPs are the same
    """
    pairs = attn_pairs if attn_pairs is not None else tokens * kv_tokens // max(batch, 1)
    flops = 2.0 * cfg.n_layers * cfg.layer_matmul_params() * tokens
    flops += 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs  # QK^T and PV
    flops += 2.0 * cfg.d_model * cfg.vocab_size * logits_rows
    kv_token_bytes = cfg.kv_bytes_per_token(dtype_bytes)
    moved = weight_bytes(cfg, dtype_bytes, with_lm_head=logits_rows > 0, quant=quant)
    moved += kv_tokens * kv_token_bytes  # attention reads the cache
    moved += tokens * kv_token_bytes  # this pass writes its K/V
    moved += tokens * cfg.d_model * dtype_bytes  # embedding rows gathered
    moved += logits_rows * cfg.vocab_size * 4  # logits written (float32)
    return StepCost(flops=flops, bytes_moved=float(moved))


def prefill_work_bytes(cfg: ModelConfig, tokens: int, longest: int, dtype_bytes: int, sequences: int = 1) -> int:
    """Peak working memory of one prefill pass, beyond the weights and the KV cache it fills.

    tokens     positions the pass computes (padding included)
    longest    the longest sequence's length: attention may hold its (H, L, L) scores in float32
    sequences  how many sequences' scores may be held at once (a padded batch: all of them)

    Activations per token: the residual, two norms' outputs and the MLP's output (4 x d), q/k/v
    (q + 2 kv), the attention output (q) and the MLP's hidden state (2 x ffn when gated, plus the
    activation). Worked example, SmolLM2-135M fp32, 30 tables x 8,128 tokens padded:
    243,840 x (4 x 576 + 960 + 576 + 3 x 1,536) x 4 B = 8.2 GB of activations, plus
    30 x 9 x 8,128^2 x 4 B = 71 GB of scores: refused long before the weights or the KV matter.
    """
    hidden = cfg.ffn_dim * (3 if cfg.mlp_gated else 2)
    per_token = (4 * cfg.d_model + cfg.q_dim + 2 * cfg.kv_dim + cfg.q_dim + hidden) * dtype_bytes
    scores = sequences * cfg.n_heads * longest * longest * 4
    logits = sequences * cfg.vocab_size * 4
    return tokens * per_token + scores + logits
