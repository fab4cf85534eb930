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
model's forward: the request never notices except in speed. What it is handed: every buffer is
checked against engine/native_contract.h, here before the call (the model's tensors once, a pass's
rows every call) and by C at its boundary, so a wrong one is one EngineError line.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np
import torch

from engine import native_contract as contract
from engine.attention import SeatKV
from engine.costs import weight_bytes
from engine.errors import EngineError
from engine.kv_pool import SeatBatch, SeatPool
from engine.model import Transformer
from engine.native_build import library
from engine.native_contract import TYPES, Buf
from engine.quant import Int8Weight

NATIVE_GROUP = 64  # rows the C side runs through every layer at a time: the scratch is sized for it
THREADS_MIN_BYTES = 64 << 20  # below this the weights stay in cache and waking threads costs more than it gains
NATIVE_LABEL = "twopot::native_decode_step"  # what a torch profiler calls the step's one C call
ACTS = {"silu": 0, "gelu": 1, "gelu_new": 2, "gelu_pytorch_tanh": 2}
F32, I64 = TYPES["F32"][0], TYPES["I64"][0]


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
    if any(isinstance(w, Int8Weight) and not w.native for w in weights):
        return "the native step's int8 weights need the engine's int8 kernel, which was not built at load"
    if any(isinstance(w, Int8Weight) and w.refine != (w is model.lm_head_t) for w in weights):
        return "the native step rounds the int8 LM head's input twice and every other product's once"
    return None


def step_label(step: NativeStep | None) -> str:
    """Which step cooks, in words the Kitchen can show: "native (AVX-512 VNNI)", "native (NEON
    dotprod)", "native (portable C)", or "op by op: <why the native step is not running>"."""
    if step is None:
        return "op by op: the native step runs on CPU only"
    return f"native ({step.isa})" if step.ready else f"op by op: {step.problem}"


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
        self.isa = lib.twopot_isa().decode() if lib is not None else None  # "AVX-512 VNNI", "NEON dotprod", ...
        self._seats: weakref.WeakKeyDictionary[SeatPool, tuple] = weakref.WeakKeyDictionary()
        self.int8 = isinstance(model.lm_head_t, Int8Weight)  # unsupported() holds every weight to one kind
        self.weight_bytes = weight_bytes(model.cfg, 4, quant="int8" if self.int8 else None)  # what a decode step reads
        self._why = ctypes.create_string_buffer(256)  # the C side's one line when it refuses a call
        self.struct = None
        if lib is not None:
            try:
                self.struct = self._describe(model)
            except EngineError as err:  # a tensor breaks the contract: say so, and run the forward
                self.problem, self.lib = str(err), None
        self._struct_ref = ctypes.byref(self.struct) if self.struct is not None else None  # made once, passed every step

    def _config(self, model: Transformer) -> dict[str, int]:
        """The model's numbers as the contract names them (native_contract.h TWOPOT_MODEL_CONFIG)."""
        cfg = model.cfg
        return dict(d=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                    head_dim=cfg.head_dim, ffn=cfg.ffn_dim, vocab=cfg.vocab_size, max_context=cfg.max_context,
                    layer_norm=int(cfg.norm == "layer"), act=ACTS[cfg.act], gated=int(cfg.mlp_gated),
                    rope=int(cfg.positions == "rope"), int8=int(self.int8), tied=int(model.embed is None))  # fmt: skip

    def _linear(self, into, w, bias, names: dict[str, int], where: str, dims: tuple[str, str]) -> None:
        names = names | {"din": names[dims[0]], "dout": names[dims[1]]}
        if isinstance(w, Int8Weight):  # int8 values and a float16 scale per 32 inputs (engine/quant.py)
            tensors = {"w": w.q, "scale": w.scale, "bias": bias}
        else:
            tensors = {"w": w, "bias": bias}
        contract.fill(into, "LINEAR_BUFFERS", tensors, names, where, keep=self._keep)

    def _describe(self, model: Transformer) -> contract.Model:
        """The model's Model struct: every tensor checked against the contract, pointed to, not copied."""
        config = self._config(model)
        names = contract.dims(config)
        self._keep: list[torch.Tensor] = []  # every tensor the struct points into: alive as long as the step
        linears = {row[0]: tuple(row[1:]) for row in contract.tables()["LAYER_LINEARS"]}  # qkv: (d, nqkv), ...
        layers = (contract.Layer * config["n_layers"])()
        for i, b in enumerate(model.layers):
            a, m, where = b.attn, b.mlp, f"layers[{i}]."
            contract.fill(layers[i], "LAYER_BUFFERS", {"norm1_w": b.attn_norm.weight, "norm1_b": b.attn_norm.bias,
                                                       "norm2_w": b.mlp_norm.weight, "norm2_b": b.mlp_norm.bias},
                          names, where, keep=self._keep)  # fmt: skip
            for name, (w, bias) in {"qkv": (a.wqkv_t, a.bqkv), "out": (a.wo_t, a.bo), "up": (m.w_up_t, m.b_up),
                                    "down": (m.w_down_t, m.b_down)}.items():  # fmt: skip
                self._linear(getattr(layers[i], name), w, bias, names, f"{where}{name}.", linears[name])
        self._layers = layers  # the struct points into this array: it lives as long as the step
        struct = contract.Model(**config, eps=model.cfg.norm_eps)
        contract.fill(struct, "MODEL_BUFFERS", {
            "embed": model.embed, "embed_cols": model.lm_head_t if model.embed is None else None, "wpe": model.wpe,
            "rope_cos": getattr(model, "rope_cos", None), "rope_sin": getattr(model, "rope_sin", None),
            "final_w": model.final_norm.weight, "final_b": model.final_norm.bias,
            "layers": Buf(ctypes.addressof(layers), config["n_layers"], TYPES["LAYER"][0])}, names, keep=self._keep)  # fmt: skip
        self._linear(struct.lm_head, model.lm_head_t, None, names, "lm_head.", ("d", "vocab"))
        return struct

    @property
    def ready(self) -> bool:
        return self.problem is None

    def _bind(self, pool: SeatPool) -> tuple:
        """The pool's Pass: each layer's K and V seats (checked against the contract once: the pool's
        tensors never change), scratch for `group` rows, and the seat numbers 0..S-1."""
        bound = self._seats.get(pool)
        if bound is None:
            names = contract.dims(self._config(self.model)) | {"seats": pool.seats, "seat_len": pool.seat_len}
            seat = contract.rows("SEAT_BUFFERS")[0]
            ks = (Buf * len(pool.k_layer))(*[contract.check(f"pass.k[{i}].", seat, t, names) for i, t in enumerate(pool.k_layer)])
            vs = (Buf * len(pool.v_layer))(*[contract.check(f"pass.v[{i}].", seat, t, names) for i, t in enumerate(pool.v_layer)])
            floats = self.lib.twopot_scratch_floats(self._struct_ref, self.group, pool.seat_len)
            scratch = torch.empty(floats)  # (floats,)
            in_order = torch.arange(pool.seats)  # decode row b sits in seat b
            p = contract.Pass(seats=pool.seats, seat_len=pool.seat_len, cap=self.group)
            for name, kind in (("tok", I64), ("pos", I64), ("seat", I64), ("logits", F32)):
                getattr(p, name).type = kind
            contract.fill(p, "PASS_BUFFERS", {"scratch": scratch, "k": Buf(ctypes.addressof(ks), len(ks), TYPES["BUF"][0]),
                                              "v": Buf(ctypes.addressof(vs), len(vs), TYPES["BUF"][0])},
                          names | {"scratch_floats": floats}, "pass.", partial=True)  # fmt: skip
            views = (p.tok, p.pos, p.seat, p.out, p.logits)  # the Pass's own Bufs, set in place each call
            bound = self._seats[pool] = (ks, vs, scratch, in_order, p, ctypes.byref(p), views)
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
        """One pass through the C step. tok, pos, seat: addresses of B int64 each (seat None: rows in
        seats 0..B-1), out: of n_out int64 or None; logits (n_out, V) float32. The caller checked them."""
        ks, vs, scratch, in_order, p, p_ref, (b_tok, b_pos, b_seat, b_out, b_logits) = self._bind(pool)
        p.rows, p.n_out, p.threads = B, n_out, self.threads(B)
        b_tok.p, b_pos.p, b_seat.p, b_out.p, b_logits.p = tok, pos, seat or in_order.data_ptr(), out, logits.data_ptr()
        b_tok.n = b_pos.n = b_seat.n = B
        b_out.n, b_out.type = (n_out, I64) if out else (0, 0)
        b_logits.n = logits.numel()
        if torch.autograd.profiler._is_profiler_enabled:  # the lesson's profiler sees the call as one op
            with torch.profiler.record_function(NATIVE_LABEL):
                rc = self.lib.twopot_step(self._struct_ref, p_ref, self._why, len(self._why))
        else:
            rc = self.lib.twopot_step(self._struct_ref, p_ref, self._why, len(self._why))
        if rc != 0:
            raise EngineError(f"native step: {self._why.value.decode()}")

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, sb: SeatBatch, pool: SeatPool) -> torch.Tensor:
        """Logits (B, V) of a pure-decode step; tokens and positions (B, 1) int64 of rows in seats 0..B-1."""
        B = tokens.shape[0]
        if self.usable(pool):
            if tokens.shape != (B, 1) or positions.shape != (B, 1) or tokens.dtype != torch.int64 \
                    or positions.dtype != torch.int64 or not 1 <= B <= pool.seats:  # fmt: skip
                raise EngineError(f"native step: tokens {tokens.dtype} {tuple(tokens.shape)}, positions {positions.dtype} "
                                  f"{tuple(positions.shape)}; a decode step takes int64 (B, 1) each, B in "
                                  f"1..{pool.seats} (the pool's seats)")  # fmt: skip
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
        if not B or len(pos) != B or len(seats) != B or len(out) > B:
            raise EngineError(f"native step: a pass takes as many positions ({len(pos)}) and seats ({len(seats)}) as "
                              f"tokens ({B}, at least 1), and at most {B} rows that sample (got {len(out)})")  # fmt: skip
        flat = np.array(ids + pos + seats + out, dtype=np.int64)  # (3B + R,) one buffer, four views
        logits = torch.empty(len(out), self.model.cfg.vocab_size)  # (R, V)
        at = flat.ctypes.data
        self._call(pool, B, at, at + 8 * B, at + 16 * B, at + 24 * B, len(out), logits)
        self.passes += 1
        return logits
