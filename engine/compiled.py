"""An optional compiled pure-decode step (`Engine.load(..., compile=True)`): fewer ops per step.

Why: a batch-1 decode step of a small model is ~22 ms of weight streaming (the GEMVs) and ~15 ms of
the ~30 small ops per layer that sit between them -- norms, residual adds, RoPE, the split of q|k|v,
the softmax of decode attention -- each a separate kernel launched cold after a weight stream.
`torch.compile` (inductor) fuses those into a few C++ loops; the GEMMs stay the same MKL calls.

How, and why this way (docs/benchmarks/compiled-cpu.md has the numbers):
* The whole step -- every layer, the final norm and the LM head -- is ONE compiled function of the
  weights, passed as tensors (`LayerWeights`), not as `nn.Module`s: compiling the `Block` module
  recompiled once per layer (its identity and layer index are guarded) and was slower than eager,
  and one compiled layer called once per layer fused the same ops but saved nothing at batch 1.
* The KV seat writes and reads happen inside it: `index_copy_` into each layer's seats (inductor
  writes the rows in place, it does not copy the pool) and a slice of seats 0..B-1 read as a view.
* The sizes that move -- batch B, the width W read from the cache, the pool's seats S and slots T
  -- are marked dynamic and come from tensor shapes, never from Python ints, so a generation
  compiles once for batch 1 and once for batch > 1 per model shape and dtype (a test counts them).
* Only steps of at most `max_batch` rows (ServingConfig.compile_max_batch) run compiled: the
  compiled step pays where the small ops between the weight streams dominate (few rows) and loses
  where the GEMMs carry the step -- its generic dynamic-shape kernels lose to eager's. Both graphs
  (batch 1, batch > 1) serve any batch up to it, so crossing it never compiles more.
* Only the serving runner's pure-decode step `(B, 1)` runs compiled (the serving core's and every
  order `generate()` cooks on seats); prefill, mixed steps and the fixed-batch lessons' kitchens
  stay eager, and so does a step that reads a seat to its last slot (see `__call__`).
* int8 weights (engine/quant.py) run compiled too: each int8 product is one opaque custom op,
  `twopot::int8_matmul` (engine/int8_op.py), that checks its input's alignment at run time, where
  a `data_ptr()` check is no graph break; `LayerWeights` then carries each weight's `Int8Parts`.
* On CUDA the graphs of each batch bucket (engine/cuda_graph.py) record this compiled step.

Compiling needs a C++ compiler on CPU (inductor builds its kernels with it) and triton on CUDA.
`compiler_problem()` says up front when one is missing; a compile that fails anyway (at the first
step, where inductor really builds) makes this step and every later one run eagerly, with the
reason kept in `failure` and warned once. The request never notices except in speed.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx.experimental import _config as fx_config

from engine.attention import SeatKV
from engine.errors import EngineError
from engine.int8_op import Int8Parts
from engine.kv_pool import SeatBatch, SeatPool
from engine.layers import Rope, apply_rope, rms_norm
from engine.model import Transformer
from engine.quant import Int8Weight, matmul

# Decode steps of more rows run eagerly. Measured on the 2-core CPU, 2 threads, fp32, spinning OpenMP
# threads (docs/benchmarks/compiled-cpu.md): compiled is 10-24 % faster at batches 1-16 on the chef
# and the 135M shape, and at 32 it gains 4 % (135M) or loses 2 % (chef); with PASSIVE it loses 9 %.
COMPILE_MAX_BATCH = 16


def check_max_batch(max_batch: int) -> None:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise EngineError(f"compile_max_batch must be an int of at least 1 (got {max_batch!r})")


@dataclass(frozen=True)
class LayerShape:
    """The constants of a layer: the same for every layer of a model, so one compiled graph fits all."""

    norm: str  # "rms" or "layer"
    eps: float
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    gated: bool
    act: str


@dataclass(frozen=True)
class LayerWeights:
    """One layer's tensors, (in, out) like engine/model.py; None where the family has no such bias.
    An int8 model's weights are `Int8Parts` (int8 rows (out, in) and their scales), used via `matmul`."""

    attn_norm: tuple[torch.Tensor, torch.Tensor | None]
    wqkv: torch.Tensor | Int8Parts  # (d, q + 2 kv)
    bqkv: torch.Tensor | None
    wo: torch.Tensor | Int8Parts  # (q, d)
    bo: torch.Tensor | None
    mlp_norm: tuple[torch.Tensor, torch.Tensor | None]
    w_up: torch.Tensor | Int8Parts  # (d, 2 ffn) gated, (d, ffn) not
    b_up: torch.Tensor | None
    w_down: torch.Tensor | Int8Parts  # (ffn, d)
    b_down: torch.Tensor | None


def _norm(
    x: torch.Tensor, weight: tuple[torch.Tensor, torch.Tensor | None], shape: LayerShape
) -> torch.Tensor:
    w, b = weight
    if shape.norm == "layer":
        return F.layer_norm(x, (x.shape[-1],), w, b, shape.eps)
    return rms_norm(x, w, shape.eps)


def _act(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "silu":
        return F.silu(x)
    return F.gelu(x) if name == "gelu" else F.gelu(x, approximate="tanh")


def _plus(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x if bias is None else x + bias


def attention(q, k_seats, v_seats, bias) -> torch.Tensor:
    """decode_attention (engine/attention.py) with explicit batched GEMMs: q (B, H, 1, D), the rows' seats
    k_seats and v_seats (B, Hkv, T, D), bias (B, 1, 1, W) -> (B, 1, H*D), reading slots 0..W-1.

    Slicing W slots and then folding (B, Hkv) into one batch makes the compiler guard on whether the
    slice is contiguous, which flips when the widest row fills its seat (W == T): a recompile of
    the whole step. Folding the whole seats first and slicing after is a view whatever W is.
    """
    B, H, _, D = q.shape
    Hkv, T, W = k_seats.shape[1], k_seats.shape[2], bias.shape[-1]
    q = q.reshape(B * Hkv, H // Hkv, D)  # (B*Hkv, G, D)
    keys = k_seats.view(B * Hkv, T, D)[:, :W]  # (B*Hkv, W, D)
    values = v_seats.view(B * Hkv, T, D)[:, :W]
    scores = torch.bmm(q, keys.transpose(1, 2))  # (B*Hkv, G, W)
    scores = scores.view(B, Hkv, H // Hkv, W) * D**-0.5 + bias  # (B, Hkv, G, W)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.bmm(probs.view(B * Hkv, H // Hkv, W), values)  # (B*Hkv, G, D)
    return out.view(B, 1, H * D)  # heads in order: (B, Hkv, G, D) -> (B, 1, H*D)


def decode_layer(
    x, cos, sin, bias, index, k_seats, v_seats, w: LayerWeights, shape: LayerShape
) -> torch.Tensor:
    """One decoder layer for B rows of one new token each, its seats' K/V written and read in place.

    x (B, 1, d); cos, sin (B, 1, 1, D) or None (learned positions); bias (B, 1, 1, W) additive;
    index (B * Hkv,) flat rows of the new K/V (SeatPool.row_index_list); k_seats, v_seats the
    layer's seats 0..B-1, (B, Hkv, T, D), contiguous. Same ops as Block.forward over SeatKV.
    """
    B, H, Hkv, D = x.shape[0], shape.n_heads, shape.n_kv_heads, shape.head_dim
    qkv = _plus(matmul(_norm(x, w.attn_norm, shape), w.wqkv), w.bqkv)  # (B, 1, q + 2kv)
    qk, v = qkv.split([(H + Hkv) * D, Hkv * D], dim=-1)
    qk = qk.view(B, 1, H + Hkv, D)  # (B, 1, H + Hkv, D)
    if cos is not None:
        qk = apply_rope(qk, Rope(cos, sin))
    q, k = qk.split([H, Hkv], dim=2)  # (B, 1, H, D), (B, 1, Hkv, D)
    k_seats.view(-1, D).index_copy_(0, index, k.reshape(-1, D))  # (B*Hkv*T, D) <- (B*Hkv, D)
    v_seats.view(-1, D).index_copy_(0, index, v.reshape(-1, D))
    att = attention(q.transpose(1, 2), k_seats, v_seats, bias)  # (B, 1, H*D)
    x = x + _plus(matmul(att, w.wo), w.bo)  # (B, 1, d)
    h = _plus(matmul(_norm(x, w.mlp_norm, shape), w.w_up), w.b_up)  # (B, 1, 2F) or (B, 1, F)
    if shape.gated:
        gate, up = h.split(shape.ffn_dim, dim=-1)
        h = _act(gate, shape.act) * up  # SwiGLU
    else:
        h = _act(h, shape.act)
    return x + _plus(matmul(h, w.w_down), w.b_down)  # (B, 1, d)


def decode_step(
    x, cos, sin, bias, index, k_seats, v_seats, layers, final_norm, lm_head, shape
) -> torch.Tensor:
    """Every layer, the final norm and the LM head of a pure-decode step: x (B, 1, d) -> logits (B, 1, V).

    k_seats, v_seats: one (B, Hkv, T, D) view per layer, the rows' seats; layers: one LayerWeights
    per layer. Views, not the whole (L, S, Hkv, T, D) pool sliced inside: writing into a slice of a
    graph input ran 6.5x slower than eager at batch 32 (678 vs 104 ms; the pool copied back, it seems).
    """
    for i, w in enumerate(layers):
        x = decode_layer(x, cos, sin, bias, index, k_seats[i], v_seats[i], w, shape)
    return matmul(_norm(x, final_norm, shape), lm_head)  # (B, 1, V)


def compiler_problem(device: torch.device) -> str | None:
    """Why torch.compile cannot build kernels here, in one line; None when it should be able to."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton  # lazy: triton is optional, CUDA only

        return None if has_triton() else "torch.compile on CUDA needs triton, which is not installed"
    from torch._inductor import config  # lazy: inductor loads only when compiling is asked for

    names = [os.environ.get("CXX"), *config.cpp.cxx]
    names = [n for n in names if n]
    if any(shutil.which(n) for n in names):
        return None
    return f"torch.compile on CPU needs a C++ compiler ({' or '.join(names)} on PATH, or set CXX); none found"


def one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]


class CompiledDecode:
    """The runner's pure-decode step as one compiled function; eager after a failure.

    Made once per Engine and shared by every Runner over its model (the serving core's and each
    order's), so a generate() pays the compile only the first time.
    """

    def __init__(self, model: Transformer, max_batch: int = COMPILE_MAX_BATCH):
        """`max_batch`: steps of more rows run eagerly (ServingConfig.compile_max_batch)."""
        check_max_batch(max_batch)
        cfg = model.cfg
        self.max_batch = max_batch
        self.model = model
        self.shape = LayerShape(cfg.norm, cfg.norm_eps, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim,
                                cfg.mlp_gated, cfg.act)  # fmt: skip
        self.layers = [_weights(block) for block in model.layers]
        self.final_norm = (model.final_norm.weight, model.final_norm.bias)
        self.lm_head = _tensor_or_parts(model.lm_head_t)
        self.steps = 0  # decode steps that ran compiled
        self.eager_steps = 0  # pure-decode steps this object ran eagerly (above max_batch, full seat, failure)
        self.failure: str | None = compiler_problem(model.device)
        # Each model shape and dtype adds a graph or two (batch 1 and batch > 1); a process that
        # loads several models must not hit dynamo's default limit of 8, which silently runs eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self.step_fn = torch.compile(decode_step, fullgraph=True)
        if self.failure is not None:
            warnings.warn(f"compile=True, decoding eagerly: {self.failure}", RuntimeWarning, stacklevel=3)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, sb: SeatBatch, pool: SeatPool
    ) -> torch.Tensor:
        """Logits (B, 1, V) of a pure-decode step, tokens and positions (B, 1): Transformer.forward over SeatKV."""
        # On CPU a step that reads its seats to the last slot (W == T: an order's very last step)
        # would need graphs of its own (the compiler guards on W < T): one step, so it runs eagerly.
        # A CUDA graph bucket reads whole seats at every step (engine/cuda_graph.py): W == T there.
        fits = tokens.shape[0] <= self.max_batch
        if fits and self.failure is None and (sb.decode_width < pool.seat_len or pool.device.type == "cuda"):
            try:
                logits = self._compiled(tokens, positions, sb, pool)
                self.steps += 1
                return logits
            except Exception as err:  # no compiler after all, an op inductor cannot lower, ...
                self.failure = f"compile failed: {one_line(err)}"
                warnings.warn(f"compile=True, decoding eagerly from now on: {self.failure}", RuntimeWarning,
                              stacklevel=2)  # fmt: skip
        # Eager, from the embeddings: a failure part-way rewrites the same K/V slots with eager values.
        self.eager_steps += 1
        return self.model(tokens, positions, SeatKV(sb, pool))

    def _compiled(self, tokens, positions, sb: SeatBatch, pool: SeatPool) -> torch.Tensor:
        model = self.model
        assert sb.decode_first == 0 and not sb.spans, (
            "the compiled step serves pure decode steps in seats 0..B-1"
        )
        x, rope = model._inputs(tokens, positions)  # (B, 1, d); cos, sin (B, 1, 1, D)
        cos, sin = (rope.cos, rope.sin) if rope is not None else (None, None)
        B = x.shape[0]
        ks = [t[:B] for t in pool.k_layer]  # (B, Hkv, T, D) each: the rows' seats, a contiguous view
        vs = [t[:B] for t in pool.v_layer]
        # The sizes that change from step to step or pool to pool are symbols of one graph, not
        # constants: B (x, rope, bias, index, seats), W (bias), T (seats). Size 1 is always a
        # constant to the compiler, so batch 1 gets a graph of its own.
        for t in (x, cos, sin, sb.decode_bias, sb.decode_index, *ks, *vs):
            if t is not None:
                torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(sb.decode_bias, 3)
        for t in (*ks, *vs):
            torch._dynamo.maybe_mark_dynamic(t, 2)
        for t in (pool.k, pool.v):  # the views' base (L, S, Hkv, T, D): guarded, as views are written
            torch._dynamo.maybe_mark_dynamic(t, 1)
            torch._dynamo.maybe_mark_dynamic(t, 3)
        # No duck shaping: sizes equal at the first compile stay distinct symbols (with it, a pool of
        # 4 seats and 4 KV heads tied the two, and the next pool recompiled).
        with fx_config.patch(use_duck_shape=False):
            return self.step_fn(x, cos, sin, sb.decode_bias, sb.decode_index, ks, vs, self.layers,
                                self.final_norm, self.lm_head, self.shape)  # fmt: skip


def _weights(block) -> LayerWeights:
    a, m = block.attn, block.mlp
    w = _tensor_or_parts
    return LayerWeights(
        (block.attn_norm.weight, block.attn_norm.bias), w(a.wqkv_t), a.bqkv, w(a.wo_t), a.bo,
        (block.mlp_norm.weight, block.mlp_norm.bias), w(m.w_up_t), m.b_up, w(m.w_down_t), m.b_down,
    )  # fmt: skip


def _tensor_or_parts(w: torch.Tensor | Int8Weight) -> torch.Tensor | Int8Parts:
    """A float weight as is; an int8 one as its tensors and constants (no module for the compiler to guard)."""
    return w.parts() if isinstance(w, Int8Weight) else w
