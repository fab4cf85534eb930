"""Smaller portions: int8 quantization of the model's matmul weights.

Why: a batch-1 decode step reads every weight once and does two FLOPs per weight, so its time is
the bytes it reads. Storing the weights as int8 (one byte each, plus one float scale per output
channel) instead of float32 (four) cuts those bytes by almost 4x. Prefill is compute-bound and
gains nothing from fewer bytes.

What is quantized: every `x @ W` weight of the network -- the fused q|k|v and out projections,
the fused gate|up and down projections of the MLP, and the LM head. The embedding table stays in
the model's dtype: a token's embedding is one gathered row, not a matmul, so shrinking it saves
no time per step. For tied models (one matrix for both) the embedding keeps its own float copy.

The numbers (per output channel n, symmetric, no zero point):
    scale[n] = max_k |W[n, k]| / 127        W[n, k] ~= q[n, k] * scale[n],  q in [-127, 127]
so the largest weight of each row is exact and every other is off by at most scale[n] / 2.

How a product is computed (`Int8Weight.forward`, i.e. the op `twopot::int8_matmul` of
engine/int8_op.py, which a compiled decode step calls too), by the number of rows:
  * few rows (decode, up to W8A8_MAX_ROWS), on a CPU whose fbgemm passed its probe: W8A8 dynamic,
    the arithmetic of llama.cpp's q8_0 products. Each row of activations is quantized to 8 bits
    over its own range at run time, int8 x int8 products are summed in int32 against a copy of the
    weight that fbgemm packed once here (`Int8Weight.w8a8`), and the per-channel scales multiply
    the float32 result. The packed copy is a second int8 copy of every matrix in memory (q stays
    for the other kernels); a decode step reads only the packed one.
  * few rows without that kernel (other torch builds, CUDA, a CPU where it saturated): W8A16,
    `torch.ops.aten._weight_int8pack_mm`, which reads the int8 weight directly with bfloat16
    activations and float32 sums (its CPU AVX-512 kernel; with float32 activations it falls back
    to a scalar loop that was 5-20x slower here). It loads 16 values at a time with aligned loads,
    so it needs the input width to be a multiple of 16 (other widths crashed or gave wrong sums in
    torch 2.13); other widths take the next kernel.
  * many rows (prefill, big batches): the weight is widened to bfloat16 (exact: |q| <= 127 fits
    bfloat16's 8-bit significand) and multiplied by torch's bfloat16 GEMM, then scaled.
`docs/benchmarks/int8-cpu.md` has the measurements behind the choice and the row thresholds.
On CUDA, torch's int8 kernel exists only in some versions and takes float32 activations and
scales: `kernel_works` tries it once per device on a small product, and the few-rows path uses it
(float32 activations, so no bf16 rounding there) when it gives the right answer; otherwise every
call widens the weight. Neither CUDA path has been timed on a GPU yet.
Norms, RoPE, attention, the KV cache and the residual stream keep the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine import native_build
from engine.errors import EngineError
from engine.int8_op import KERNEL_MAX_ROWS as KERNEL_MAX_ROWS  # re-exported: tests and docs name it here
from engine.int8_op import KERNEL_WIDTH_MULTIPLE, Int8Parts, W8A8Pack, int8_product, pack_w8a8

QUANT_MODES = ("int8",)
QMAX = 127  # symmetric: -127..127, so -q is always representable
_KERNEL_WORKS: dict[str, bool] = {}  # device -> did the int8 kernel give the right product there


INT8_PRECISION = "int8"  # the app's Precision choice: int8 matrices, float32 activations and KV cache


def precision_parts(precision: str) -> tuple[str, str | None]:
    """The app's one Precision string -> (dtype, quant): "int8" is ("float32", "int8"), any other
    is a dtype with full-precision weights ("bfloat16" -> ("bfloat16", None))."""
    return ("float32", "int8") if precision == INT8_PRECISION else (precision, None)


def parse_quant(quant: str | None) -> str | None:
    """None (full-precision weights) or one of QUANT_MODES; anything else is refused in one line."""
    if quant is None or quant in ("", "none"):
        return None
    if quant not in QUANT_MODES:
        raise EngineError(f"invalid quant '{quant}' (use {' or '.join(QUANT_MODES)}, or none)")
    return quant


def kernel_dtype(device: torch.device) -> torch.dtype:
    """The activation (and scale) dtype torch's int8 kernel runs fast with on this device type."""
    return torch.bfloat16 if device.type == "cpu" else torch.float32


def kernel_works(device: torch.device) -> bool:
    """Whether `_weight_int8pack_mm` exists on this device and computes x @ (q * scale)^T, tried once.

    A probe, not a version check: the op's CUDA kernel appeared in some torch versions only, and a
    wrong answer must be as disqualifying as a missing op.
    """
    key = str(device)
    if key not in _KERNEL_WORKS:
        dt, gen = kernel_dtype(device), torch.Generator().manual_seed(0)
        x = torch.randn(3, 32, generator=gen).to(device, dt)  # (M, K)
        q = torch.randint(-QMAX, QMAX + 1, (48, 32), generator=gen, dtype=torch.int8).to(device)  # (N, K)
        s = (torch.rand(48, generator=gen) / 64).to(device, dt)  # (N,)
        try:
            y = torch.ops.aten._weight_int8pack_mm(x, q, s).float()
            ref = (x.float() @ q.float().t()) * s.float()
            _KERNEL_WORKS[key] = bool(torch.allclose(y, ref, rtol=2e-2, atol=2e-2))
        except (RuntimeError, NotImplementedError):
            _KERNEL_WORKS[key] = False
    return _KERNEL_WORKS[key]


class Int8Weight(nn.Module):
    """A weight used as `x @ W_t` (W_t of shape (in, out)), stored as int8 rows with one scale each.

    Buffers: `q` (out, in) int8, contiguous (the kernels read each output channel's row);
    `scale` (out,) bfloat16 (quantization used this rounded scale); `kernel_scale` (out,) the same
    values in float32 on CUDA (its W8A16 kernel takes them so), None on CPU.
    `w8a8`: fbgemm's packed copy of q for the few-rows W8A8 kernel (engine/int8_op.py), made here
    once, or None where that kernel is missing or failed its probe (then W8A16 serves those rows).
    It is a plain attribute, not a buffer: its handle tensor owns native memory that must not be
    copied byte by byte (`.to()`, a state dict).
    """

    def __init__(self, w_t: torch.Tensor):
        super().__init__()
        w = w_t.t().float()  # (in, out) -> (out, in), the kernel's layout
        scale = (w.abs().amax(dim=1) / QMAX).clamp(min=torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
        q = torch.round(w / scale.float()[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)  # (out, in)
        self.register_buffer("q", q.contiguous())
        self.register_buffer("scale", scale)
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        dev = w_t.device
        self.kernel_dtype = kernel_dtype(dev)
        # The engine's own W8A8 product (engine/native_build.py) where it is built: it needs each
        # row's sum of q, and applies no scale itself, so the float32 scales multiply its result.
        # Plain attributes, not buffers, like the W8A8 pack: `weight_bytes` counts q and its scales once.
        native = dev.type == "cpu" and native_build.ready()
        self.rowsum = q.sum(1, dtype=torch.int32) if native else None  # (out,)
        self.native_scale = scale.float() if native else None  # (out,) the scales as its result takes them
        self.w8a8: W8A8Pack | None = None if native else pack_w8a8(self.q, scale)
        self.register_buffer("kernel_scale", scale.to(self.kernel_dtype) if dev.type != "cpu" else None)
        aligned = dev.type != "cpu" or self.in_features % KERNEL_WIDTH_MULTIPLE == 0
        self.use_kernel = aligned and kernel_works(dev)

    @property
    def shape(self) -> tuple[int, int]:
        """(in, out), like the float weight it replaces (cost models and ceilings read it)."""
        return self.in_features, self.out_features

    def parts(self) -> Int8Parts:
        """The current buffers and constants, as the op (engine/int8_op.py) and a compiled step take them."""
        pack = self.w8a8
        if self.rowsum is not None:
            return Int8Parts(self.q, self.scale, self.native_scale, self.use_kernel, self.in_features,
                             self.out_features, rowsum=self.rowsum)  # fmt: skip
        if pack is None:
            return Int8Parts(self.q, self.scale, self.kernel_scale, self.use_kernel, self.in_features,
                             self.out_features)  # fmt: skip
        return Int8Parts(self.q, self.scale, pack.scale, self.use_kernel, self.in_features, self.out_features,
                         pack.packed, pack.col_offsets, pack.zero_bias)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out) in x's dtype: `torch.ops.twopot.int8_matmul` (engine/int8_op.py)."""
        return int8_product(x, self.parts())


_row_floor = 1  # fewest rows a float product runs with in this process (see `set_row_floor`)


def set_row_floor(rows: int) -> None:
    """Run every float product with at least `rows` rows in this process, zero rows added below
    it and dropped after. Batch-invariant mode sets it (engine/invariance.py `require`) where this
    CPU's BLAS sums a row the same way for every count of rows at or above the floor but takes
    another kernel below it (a GEMV for one row). Process-wide, like the BLAS itself."""
    global _row_floor
    _row_floor = rows


def matmul(x: torch.Tensor, w: torch.Tensor | Int8Weight | Int8Parts) -> torch.Tensor:
    """`x @ W_t` for a float weight of shape (in, out); an int8 weight (the module or its
    `Int8Parts`) runs the int8 op: the same code eager and compiled."""
    if isinstance(w, torch.Tensor):
        if _row_floor > 1 and x.numel() < _row_floor * x.shape[-1]:
            return _floored(x, w, _row_floor)
        return x @ w
    return int8_product(x, w.parts() if isinstance(w, Int8Weight) else w)


def _floored(x: torch.Tensor, w: torch.Tensor, floor: int) -> torch.Tensor:
    """x (..., in) with fewer than `floor` rows -> x @ w, computed as a `floor`-row product."""
    rows = x.reshape(-1, x.shape[-1])  # (R, in)
    padded = torch.zeros(floor, rows.shape[1], dtype=rows.dtype, device=rows.device)  # (floor, in)
    padded[: rows.shape[0]] = rows
    return (padded @ w)[: rows.shape[0]].view(*x.shape[:-1], w.shape[-1])  # (..., out)


@dataclass(frozen=True)
class QuantReport:
    """What `quantize` changed: how many weights, and the bytes before and after (embedding copy included)."""

    mode: str
    weights: int  # matrices replaced by Int8Weight
    bytes_before: int
    bytes_after: int


def _replace(module: nn.Module, name: str) -> tuple[int, int]:
    w_t = module._buffers.pop(name)  # (in, out) float
    qw = Int8Weight(w_t)
    setattr(module, name, qw)  # a submodule now: named_buffers() reports q and scale
    return w_t.numel() * w_t.element_size(), qw.q.numel() + qw.scale.numel() * qw.scale.element_size()


def quantize(model: nn.Module, mode: str = "int8") -> QuantReport:
    """Replace every matmul weight of an engine.model.Transformer by an Int8Weight, in place.

    A tied model first gets its own float embedding table (the LM head matrix, transposed), so
    embedding a token still gathers exact float rows.
    """
    parse_quant(mode)
    before = after = 0
    if model.embed is None:  # tied: the (d, V) head doubled as the embedding table
        model.embed = model.lm_head_t.t().contiguous()  # (V, d), model dtype
        after += model.embed.numel() * model.embed.element_size()
    count = 0
    for block in model.layers:
        for module, name in ((block.attn, "wqkv_t"), (block.attn, "wo_t"), (block.mlp, "w_up_t"),
                             (block.mlp, "w_down_t")):  # fmt: skip
            b, a = _replace(module, name)
            before, after, count = before + b, after + a, count + 1
    b, a = _replace(model, "lm_head_t")
    return QuantReport(mode, count + 1, before + b, after + a)
