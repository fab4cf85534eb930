"""The native step: every pass of the model on a CPU in one C call (engine/native_step.c).

Why: on a CPU the soup pot's step is a chain of ~150 small torch ops between a few weight streams,
and each op pays Python and dispatch whatever its size. For the chef (5 M parameters, weights in
cache) that glue is most of the step; for a 135M model torch's fp32 GEMV reads the weights slower
than one core can stream them, and at many rows MKL's GEMM reaches about 70% of what a kernel
shaped for these matrices gets. llama.cpp, what a CPU user would run instead, pays none of it. The
native step runs every layer -- norms, projections, RoPE, the K/V write into the seats, attention,
the MLP -- and the LM head in C, over the model's own weights and the runner's own KV seats,
through pointers: no copy, no second set of weights.

Two entries, one C function: `__call__` is the decode step (the same interface as the compiled
step, engine/compiled.py), and `run` is any other pass -- a prompt, prompt chunks beside decode
rows, a speculative draft check -- whose rows name their seats and whose logits are made only for
the rows that sample. A pass of more than `group` rows goes through every layer `group` rows at a
time, which is chunked prefill inside one call.

When it runs: on CPU, float32 activations, float32 or int8 weights (engine/quant.py), any family
of engine/config.py. Batch-invariant mode and CUDA stay on the model's forward, which remains the
one definition of the math: tests/test_native.py holds this step to it and to transformers.

How it is built: engine/native_build.py compiles native_step.c once per machine with its C compiler.
Without a compiler, or if the build fails, `problem` says why in one line and every pass runs the
model's forward: the request never notices except in speed.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np
import torch

from engine.attention import SeatKV
from engine.costs import weight_bytes
from engine.errors import EngineError
from engine.kv_pool import SeatBatch, SeatPool
from engine.model import Transformer
from engine.native_build import library
from engine.quant import Int8Weight

NATIVE_GROUP = 64  # rows the C side runs through every layer at a time: the scratch is sized for it
THREADS_MIN_BYTES = 64 << 20  # below this the weights stay in cache and waking threads costs more than it gains
NATIVE_LABEL = "twopot::native_decode_step"  # what a torch profiler calls the step's one C call
ACTS = {"silu": 0, "gelu": 1, "gelu_new": 2, "gelu_pytorch_tanh": 2}


class _Linear(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("rowsum", ctypes.c_void_p),
                ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("norm1_w", "norm1_b", "norm2_w", "norm2_b")] + [
        (n, _Linear) for n in ("qkv", "out", "up", "down")
    ]


class _Model(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("d", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab",
                                            "max_context", "layer_norm", "act", "gated", "rope", "int8")] + [
        ("eps", ctypes.c_float),
        *[(n, ctypes.c_void_p) for n in ("embed", "embed_cols", "wpe", "rope_cos", "rope_sin", "final_w", "final_b")],
        ("lm_head", _Linear),
        ("layers", ctypes.POINTER(_Layer)),
    ]  # fmt: skip


def unsupported(model: Transformer) -> str | None:
    """Why this model cannot take the native step, in one line; None when it can."""
    if model.device.type != "cpu":
        return f"the native step runs on CPU (the model is on {model.device.type})"
    if model.dtype != torch.float32:
        return f"the native step runs float32 activations (the model's are {model.dtype})"
    cfg = model.cfg
    if cfg.act not in ACTS:
        return f"the native step has no activation '{cfg.act}'"
    if cfg.positions == "rope" and cfg.head_dim % 2:
        return "the native step needs an even head size for RoPE"
    weights = [model.lm_head_t] + [w for b in model.layers for w in (b.attn.wqkv_t, b.attn.wo_t, b.mlp.w_up_t,
                                                                      b.mlp.w_down_t)]  # fmt: skip
    if len({isinstance(w, Int8Weight) for w in weights}) > 1:
        return "the native step needs every weight int8 or every weight float32"
    if any(isinstance(w, Int8Weight) and w.rowsum is None for w in weights):
        return "the native step's int8 weights need the engine's W8A8 kernel, which was not built at load"
    return None


def _ptr(t: torch.Tensor | None) -> int | None:
    if t is None:
        return None
    assert t.is_contiguous() and t.dtype in (torch.float32, torch.int8, torch.int32), "the native step reads packed tensors"
    return t.data_ptr()


class NativeStep:
    """The runner's passes as one C call each; the model's forward where it cannot run.

    Made once per Engine and shared by every Runner over its model (the serving core's and each
    order's), like engine/compiled.py's step. `problem` is None when the step is ready.
    """

    def __init__(self, model: Transformer, group: int = NATIVE_GROUP):
        self.model, self.group = model, group
        self.steps = 0  # pure-decode steps that ran natively
        self.passes = 0  # prefill and mixed passes that ran natively
        self.eager_steps = 0  # pure-decode steps handed to the model's forward (the step cannot run here)
        self.problem: str | None = unsupported(model)
        lib = library() if self.problem is None else None
        if isinstance(lib, str):
            self.problem, lib = lib, None
        self.lib = lib
        self._seats: weakref.WeakKeyDictionary[SeatPool, tuple] = weakref.WeakKeyDictionary()
        self.int8 = isinstance(model.lm_head_t, Int8Weight)  # unsupported() holds every weight to one kind
        self.weight_bytes = weight_bytes(model.cfg, 4, quant="int8" if self.int8 else None)  # what a decode step reads
        self.struct = self._describe(model) if lib is not None else None
        self._struct_ref = ctypes.byref(self.struct) if lib is not None else None  # made once, passed every step

    def _linear(self, w, bias) -> _Linear:
        if isinstance(w, Int8Weight):
            # the float32 scales and row sums of the engine's W8A8 product (engine/quant.py)
            return _Linear(_ptr(w.q), _ptr(w.native_scale), _ptr(w.rowsum), _ptr(bias))
        return _Linear(_ptr(w), None, None, _ptr(bias))

    def _describe(self, model: Transformer) -> _Model:
        cfg = model.cfg
        layers = (_Layer * cfg.n_layers)()
        for i, b in enumerate(model.layers):
            a, m = b.attn, b.mlp
            layers[i] = _Layer(_ptr(b.attn_norm.weight), _ptr(b.attn_norm.bias), _ptr(b.mlp_norm.weight),
                               _ptr(b.mlp_norm.bias), self._linear(a.wqkv_t, a.bqkv), self._linear(a.wo_t, a.bo),
                               self._linear(m.w_up_t, m.b_up), self._linear(m.w_down_t, m.b_down))  # fmt: skip
        self._layers = layers  # the struct points into this array: it lives as long as the step
        rope = cfg.positions == "rope"
        return _Model(
            cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.vocab_size,
            cfg.max_context, int(cfg.norm == "layer"), ACTS[cfg.act], int(cfg.mlp_gated), int(rope), int(self.int8),
            cfg.norm_eps, _ptr(model.embed), None if model.embed is not None else _ptr(model.lm_head_t),
            _ptr(model.wpe), _ptr(model.rope_cos) if rope else None, _ptr(model.rope_sin) if rope else None,
            _ptr(model.final_norm.weight), _ptr(model.final_norm.bias), self._linear(model.lm_head_t, None),
            layers,
        )  # fmt: skip

    @property
    def ready(self) -> bool:
        return self.problem is None

    def _bind(self, pool: SeatPool) -> tuple:
        """Each layer's K and V seat pointers, the seat numbers 0..S-1, and scratch for `group` rows."""
        bound = self._seats.get(pool)
        if bound is None:
            L = len(pool.k_layer)
            ks = (ctypes.c_void_p * L)(*[_ptr(t) for t in pool.k_layer])
            vs = (ctypes.c_void_p * L)(*[_ptr(t) for t in pool.v_layer])
            scratch = torch.empty(self.lib.twopot_scratch_floats(self._struct_ref, self.group, pool.seat_len))
            in_order = torch.arange(pool.seats)  # decode row b sits in seat b
            bound = self._seats[pool] = (ks, vs, scratch, in_order)
        return bound

    def threads(self, rows: int = 1) -> int:
        """The engine's threads (torch.get_num_threads) share a pass's products and attention when
        the weights are larger than `THREADS_MIN_BYTES` (reading them is the step), or when the pass
        fills a whole group of rows (a prompt: the products are arithmetic). A decode step of a model whose weights
        sit in cache runs on one: waking a second thread costs more than it gains (measured)."""
        big = self.weight_bytes >= THREADS_MIN_BYTES or rows >= self.group
        return torch.get_num_threads() if big else 1

    def usable(self, pool: SeatPool) -> bool:
        return self.problem is None and pool.dtype == torch.float32

    def _call(self, pool: SeatPool, B: int, tok: int, pos: int, seat: int | None, out: int | None, n_out: int,
              logits: torch.Tensor) -> None:  # fmt: skip
        ks, vs, scratch, in_order = self._bind(pool)
        args = (self._struct_ref, B, tok, pos, seat or in_order.data_ptr(), pool.seats, ks, vs, pool.seat_len, n_out,
                out, logits.data_ptr(), scratch.data_ptr(), self.group, self.threads(B))  # fmt: skip
        if torch.autograd.profiler._is_profiler_enabled:  # the lesson's profiler sees the call as one op
            with torch.profiler.record_function(NATIVE_LABEL):
                rc = self.lib.twopot_step(*args)
        else:
            rc = self.lib.twopot_step(*args)
        if rc != 0:
            raise EngineError(f"native step: a position, seat or token is outside the pool (seat_len {pool.seat_len}, "
                              f"{pool.seats} seats)")  # fmt: skip

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, sb: SeatBatch, pool: SeatPool) -> torch.Tensor:
        """Logits (B, V) of a pure-decode step; tokens and positions (B, 1) int64 of rows in seats 0..B-1."""
        B = tokens.shape[0]
        if self.usable(pool):
            logits = torch.empty(B, self.model.cfg.vocab_size)  # (B, V)
            tok, pos = tokens.contiguous(), positions.contiguous()
            self._call(pool, B, tok.data_ptr(), pos.data_ptr(), None, None, B, logits)
            self.steps += 1
            return logits
        self.eager_steps += 1  # the model's own pass over the same seats
        return self.model.forward(tokens, positions, SeatKV(sb, pool)).view(B, -1)

    def run(self, ids: list[int], pos: list[int], seats: list[int], out: list[int], pool: SeatPool) -> torch.Tensor:
        """Logits (len(out), V) of any pass: row i feeds ids[i] at pos[i] of the sequence in seats[i]; the
        rows of one seat come in ascending positions (a prompt chunk). Only rows `out` (ascending) get
        logits. Runs `group` rows at a time (chunked prefill inside one call). Check `usable` first."""
        B = len(ids)
        flat = np.array(ids + pos + seats + out, dtype=np.int64)  # (3B + R,) one buffer, four views
        logits = torch.empty(len(out), self.model.cfg.vocab_size)  # (R, V)
        at = flat.ctypes.data
        self._call(pool, B, at, at + 8 * B, at + 16 * B, at + 24 * B, len(out), logits)
        self.passes += 1
        return logits
