"""An optional compiled pure-decode step (`Engine.load(..., compile=True)`): fewer ops per step.

Why: a batch-1 decode step of a small model is a chain of ~150 small ops -- norms, residual adds,
RoPE, the split of q|k|v, the softmax of decode attention -- between a few GEMMs, and on CPU each
op costs its dispatch whatever its size. `torch.compile` (inductor) fuses the small ops into a few
C++ loops; the GEMMs stay the same MKL calls.

What is compiled is the model's own forward pass, `Transformer.forward` over a decode-only
`SeatKV` view of the seats (engine/attention.py, engine/kv_pool.py): there is one definition of
the layer math, the model's, and this
file only says when and how to run it compiled. How, and why this way (the numbers are in
docs/benchmarks/compiled-cpu.md and overhead-cpu.md):
* One graph per step shape, not per layer: the whole pass is one compiled call (a compiled call's
  guards and wrapper cost ~20 us, more than a layer's fused ops save).
* The KV seats are written in place inside the graph. Each layer's seats are a tensor of their own
  (engine/kv_pool.py): views of one pool tensor made the compiler copy whole seats back at every
  step (600 ms a step on the serving pool instead of 1.7).
* The sizes that move -- batch B, the width W read from the cache, the pool's seats S and slots T
  -- are marked dynamic, and the pass reads B and W from the mask bias's shape
  (`SeatBatch.n_decode`, `decode_width`), never from Python ints, so a generation compiles once for
  batch 1 and once for batch > 1 per model shape and dtype (a test counts them).
* Only steps of at most `max_batch` rows (EngineSettings.compile_max_batch) run compiled: the
  compiled step pays where the small ops between the weight streams dominate (few rows) and loses
  where the GEMMs carry the step. Both graphs serve any batch up to it.
* Only the runner's pure-decode step `(B, 1)` runs compiled (the serving core's and every order
  `generate()` cooks on seats); prefill, mixed steps and the fixed-batch lessons' kitchens stay
  eager, and so does a step that reads a seat to its last slot (see `__call__`).
* int8 weights (engine/quant.py) run compiled too: each int8 product is one opaque custom op,
  `twopot::int8_matmul` (engine/int8_op.py), that checks its input's alignment at run time.
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

import torch
from torch.fx.experimental import _config as fx_config

from engine.attention import SeatKV
from engine.errors import EngineError
from engine.kv_pool import SeatBatch, SeatPool
from engine.model import Transformer

# Decode steps of more rows run eagerly. Measured on the 2-core CPU, 2 threads, fp32, spinning OpenMP
# threads (docs/benchmarks/compiled-cpu.md): compiled is 10-24 % faster at batches 1-16 on the chef
# and the 135M shape, and at 32 it gains 4 % (135M) or loses 2 % (chef); with PASSIVE it loses 9 %.
COMPILE_MAX_BATCH = 16


def check_max_batch(max_batch: int) -> None:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise EngineError(f"compile_max_batch must be an int of at least 1 (got {max_batch!r})")


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
        """`max_batch`: steps of more rows run eagerly (EngineSettings.compile_max_batch)."""
        check_max_batch(max_batch)
        self.max_batch = max_batch
        self.model = model
        self.steps = 0  # decode steps that ran compiled
        self.eager_steps = 0  # pure-decode steps this object ran eagerly (above max_batch, full seat, failure)
        self.failure: str | None = compiler_problem(model.device)
        # Each model shape and dtype adds a graph or two (batch 1 and batch > 1); a process that
        # loads several models must not hit dynamo's default limit of 8, which silently runs eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self.step_fn = torch.compile(self._decode_pass, fullgraph=True)
        if self.failure is not None:
            warnings.warn(f"compile=True, decoding eagerly: {self.failure}", RuntimeWarning, stacklevel=3)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, sb: SeatBatch, pool: SeatPool
    ) -> torch.Tensor:
        """Logits (B, 1, V) of a pure-decode step, tokens and positions (B, 1): the model's forward over the seats."""
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
        return self._decode_pass(tokens, positions, sb, pool)

    def _decode_pass(self, tokens, positions, sb: SeatBatch, pool: SeatPool) -> torch.Tensor:
        """The model's own forward over the seats: the one definition of the layer math, eager or compiled."""
        return self.model.forward(tokens, positions, SeatKV(sb, pool))

    def _compiled(self, tokens, positions, sb: SeatBatch, pool: SeatPool) -> torch.Tensor:
        assert sb.decode_first == 0 and not sb.spans and sb.decode_bias is not None, (
            "the compiled step serves pure decode steps in seats 0..B-1"
        )
        # The sizes that change from step to step or pool to pool are symbols of one graph, not
        # constants: B (tokens, positions, bias, index), W (bias), S and T (seats). Size 1 is
        # always a constant to the compiler, so batch 1 gets a graph of its own.
        for t in (tokens, positions, sb.decode_bias, sb.decode_index):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(sb.decode_bias, 3)
        for t in (*pool.k_layer, *pool.v_layer):
            torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(t, 2)
        # No duck shaping: sizes equal at the first compile stay distinct symbols (with it, a pool of
        # 4 seats and 4 KV heads tied the two, and the next pool recompiled).
        with fx_config.patch(use_duck_shape=False):
            return self.step_fn(tokens, positions, sb, pool)
