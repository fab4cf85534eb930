"""The int8 weight product as one opaque op, `torch.ops.twopot.int8_matmul`: eager and compiled alike.

Why an op of its own: the kernel is picked per call by the number of rows, and the CPU W8A16
kernel needs its input 64-byte aligned. Inside `torch.compile` a look at `data_ptr()` or at a
symbolic row count is a graph break, so the checks and the choice run inside the op at run time;
the compiler sees one call with a known output shape and dtype (`register_fake`) and fuses
everything around it (the norm before it, the residual add after it).

One code path: `engine.quant.matmul` calls `int8_product` for every int8 weight, eagerly (the
`Int8Weight` module, through its `Int8Parts`), in the eager and the compiled decode step alike.

Which kernel, per call (the numbers: docs/benchmarks/int8-cpu.md):
  * at most W8A8_MAX_ROWS rows, on a CPU whose fbgemm passed `w8a8_works`: W8A8 dynamic, the
    arithmetic of llama.cpp's q8_0 products. fbgemm's `fbgemm_linear_int8_weight_fp32_activation`
    quantizes the float32 activations to 8 bits (one affine range over its input, chosen per
    call), sums int8 x int8 products in int32 against a copy of the weight packed once at load
    (`pack_w8a8`), and the per-channel scales multiply the float32 result. Several rows are first
    divided by their own largest |x| (and the result multiplied back), so each row is quantized
    with its own precision and a row with outliers does not coarsen its neighbours. At one thread
    it was 1.4-2.7x faster than the W8A16 kernel below on the 135M shape's weights (1-16 rows),
    level with it on the chef's (1-4 rows), and faster than the widened bf16 GEMM up to 64 rows;
  * otherwise, at most KERNEL_MAX_ROWS rows and a usable kernel: `_weight_int8pack_mm` (W8A16)
    reads the int8 weight directly with bfloat16 activations (float32 ones on CUDA);
  * otherwise the weight is widened to bfloat16 (exact: |q| <= 127) for torch's bfloat16 GEMM.
The result is float32 wherever a W8A8 pack (or CUDA's float32 kernel) exists, bfloat16 otherwise:
the row count may be a symbol of the compiled graph, so the output's dtype never depends on it.
With a pack the op returns x @ q^T for every row count and `int8_product` multiplies by the scales,
so a compiled step fuses that multiplication into whatever consumes the product.
Without fbgemm (other builds, CUDA), or where its probe fails, no pack is made: the W8A16 kernel
serves up to KERNEL_MAX_ROWS rows and the widened GEMM the rest.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from engine import native_ops

KERNEL_MAX_ROWS = 8  # up to this many rows the W8A16 kernel beat a bf16 GEMM on widened weights (int8-cpu.md)
W8A8_MAX_ROWS = 64  # up to this many rows W8A8 beat both W8A16 kernels at 1 thread (int8-cpu.md)
KERNEL_WIDTH_MULTIPLE = 16  # the CPU W8A16 kernel's aligned loads need the input width in multiples of this
KERNEL_ALIGN = 64  # bytes: the CPU W8A16 kernel's aligned loads need its input to start on such a boundary
_W8A8_WORKS: dict[str, bool] = {}  # "cpu" -> did fbgemm's W8A8 product give the right answer here


@dataclass(frozen=True)
class W8A8Pack:
    """fbgemm's copy of one int8 weight q (out, in), packed once at load for its int8 x int8 kernel.

    packed: a uint8 handle tensor that owns fbgemm's packed matrix (~1.4 bytes per weight here, which
    its numel does not show; a copy of the handle is no handle, so it is never cloned); col_offsets (out,) int32: each channel's sum of q (the kernel undoes the
    activations' zero point with it); zero_bias (out,) float32 zeros (the kernel's bias is not
    optional); scale (out,) float32: the per-channel scales, applied to the kernel's float32 result.
    CPU only. None of it is a module buffer (`ModelInfo.weight_bytes` counts q and its bf16 scales).
    """

    packed: torch.Tensor
    col_offsets: torch.Tensor
    zero_bias: torch.Tensor
    scale: torch.Tensor


def _fbgemm(x: torch.Tensor, q: torch.Tensor, packed, col_offsets, zero_bias) -> torch.Tensor:
    """x (M, in) float32 -> (M, out) float32: x quantized to 8 bits over its own range, int32 sums, q unscaled.

    torch 2.13 calls this legacy entry point deprecated, once per process: `w8a8_works` makes that
    first call and silences it, so no warning guard is needed (or paid for) per call."""
    return torch.fbgemm_linear_int8_weight_fp32_activation(x, q, packed, col_offsets, 1.0, 0, zero_bias)


def w8a8_works() -> bool:
    """Whether this torch has fbgemm's W8A8 product and it is exact on a product that saturates
    16-bit pair sums (CPUs without VNNI add u8 x s8 pairs in int16), tried once."""
    if "cpu" not in _W8A8_WORKS:
        try:
            q = torch.full((48, 64), 127, dtype=torch.int8)  # (out, in)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                packed = torch.fbgemm_pack_quantized_matrix(q)
                y = _fbgemm(torch.ones(2, 64), q, packed, q.sum(1, dtype=torch.int32), torch.zeros(48))
            _W8A8_WORKS["cpu"] = bool(torch.allclose(y, torch.full((2, 48), 127.0 * 64), rtol=1e-3))
        except (AttributeError, RuntimeError, NotImplementedError):  # absent from this build, or no fbgemm
            _W8A8_WORKS["cpu"] = False
    return _W8A8_WORKS["cpu"]


def pack_w8a8(q: torch.Tensor, scale: torch.Tensor) -> W8A8Pack | None:
    """The W8A8 pack of an int8 weight q (out, in) with scales (out,), or None where the kernel is missing or wrong."""
    if q.device.type != "cpu" or not w8a8_works():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packed = torch.fbgemm_pack_quantized_matrix(q)
    return W8A8Pack(packed, q.sum(1, dtype=torch.int32), torch.zeros(q.shape[0]), scale.to(torch.float32))


def w8a8_product(x: torch.Tensor, q: torch.Tensor, pack: W8A8Pack) -> torch.Tensor:
    """x (M, in) -> x @ (q * scale)^T (M, out) float32, activations quantized per row to 8 bits.

    The op runs exactly this, leaving the multiplication by the scales to its caller (where a
    compiled step fuses it into whatever consumes the product); the kernel probe and tests call it.
    """
    return _w8a8_unscaled(x, q, pack.packed, pack.col_offsets, pack.zero_bias).mul_(pack.scale)


def _w8a8_unscaled(x: torch.Tensor, q: torch.Tensor, packed, col_offsets, zero_bias) -> torch.Tensor:
    """x (M, in) -> x @ q^T (M, out) float32, q's scales not applied.

    One row is quantized over its own range by the kernel. Several rows are each divided by their
    largest |x| first (the kernel then chooses one range, about [-1, 1], for all), and each row of
    the result is multiplied back: every row keeps its own precision.
    """
    x = x.float()
    if x.shape[0] == 1:
        return _fbgemm(x, q, packed, col_offsets, zero_bias)  # (1, out)
    r = x.abs().amax(1, keepdim=True).clamp_(min=torch.finfo(torch.float32).tiny)  # (M, 1)
    return _fbgemm(x / r, q, packed, col_offsets, zero_bias).mul_(r)  # (M, out)


@dataclass(frozen=True)
class Int8Parts:
    """What one int8 product needs, as tensors and constants (a compiled function takes these, not
    an nn.Module, whose identity the compiler would guard on).

    q (out, in) int8, contiguous; scale (out,) bfloat16; kernel_scale (out,) float32 where a kernel
    takes float32 scales (CUDA's W8A16; on CPU the W8A8Pack's scale), None otherwise; use_kernel: the
    W8A16 kernel works here for this width; packed, col_offsets, zero_bias: the W8A8Pack's, or None.
    """

    q: torch.Tensor
    scale: torch.Tensor
    kernel_scale: torch.Tensor | None
    use_kernel: bool
    in_features: int
    out_features: int
    packed: torch.Tensor | None = None
    col_offsets: torch.Tensor | None = None
    zero_bias: torch.Tensor | None = None
    rowsum: torch.Tensor | None = None  # (out,) int32, where the engine's own W8A8 product serves (native_ops.py)


def result_dtype(kernel_scale: torch.Tensor | None) -> torch.dtype:
    """The op's output dtype: bfloat16, or float32 where a kernel works in float32 (a bf16 result widens exactly)."""
    return torch.bfloat16 if kernel_scale is None else kernel_scale.dtype


@torch.library.custom_op("twopot::int8_matmul", mutates_args=())
def int8_matmul(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, kernel_scale: torch.Tensor | None, use_kernel: bool,
    packed: torch.Tensor | None = None, col_offsets: torch.Tensor | None = None,
    zero_bias: torch.Tensor | None = None, rowsum: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """x (M, in) -> x @ (q * scale)^T (M, out) in `result_dtype(kernel_scale)`; with a W8A8 pack
    (packed, col_offsets, zero_bias) x @ q^T in float32 instead, which the caller scales.

    x in any float dtype. With a pack and few rows: W8A8 on x as it is. Otherwise x is rounded to
    bfloat16 here unless it already is (without a pack the caller rounds on CPU, so a compiler can
    fuse the rounding into the op that made x); on CUDA's W8A16 path x goes to the kernel in
    float32 instead, unrounded.
    """
    out_dtype = result_dtype(kernel_scale)
    if rowsum is not None or packed is not None:  # a W8A8 kernel: the engine's own (native_step.c) or fbgemm's
        if x.shape[0] > W8A8_MAX_ROWS:
            return (x.to(torch.bfloat16) @ q.t().to(torch.bfloat16)).float()  # (M, out); widening is exact
        if rowsum is not None:  # the native step's arithmetic
            return native_ops.int8_unscaled(x, q, rowsum)  # (M, out) float32
        return _w8a8_unscaled(x, q, packed, col_offsets, zero_bias)  # (M, out) float32
    if use_kernel and x.shape[0] <= KERNEL_MAX_ROWS:
        if x.device.type != "cpu":  # CUDA: float32 activations and scales
            xk = x.to(kernel_scale.dtype).contiguous()  # (M, in)
            return torch.ops.aten._weight_int8pack_mm(xk, q, kernel_scale)  # (M, out)
        x2 = x.to(torch.bfloat16)  # (M, in); x itself when the caller rounded
        if x2.data_ptr() % KERNEL_ALIGN or not x2.is_contiguous():  # aligned loads: a fresh, packed buffer
            x2 = x2.clone(memory_format=torch.contiguous_format)
        return torch.ops.aten._weight_int8pack_mm(x2, q, scale)  # (M, out) bf16
    y = (x.to(torch.bfloat16) @ q.t().to(torch.bfloat16)).mul_(scale)  # (M, out) bf16; widening is exact
    return y if y.dtype == out_dtype else y.to(out_dtype)


@int8_matmul.register_fake
def _(x, q, scale, kernel_scale, use_kernel, packed=None, col_offsets=None, zero_bias=None, rowsum=None):
    return x.new_empty((x.shape[0], q.shape[0]), dtype=result_dtype(kernel_scale))  # (M, out)


_OP = torch.ops.twopot.int8_matmul.default  # the dispatcher's entry: a few microseconds less per call


def int8_product(x: torch.Tensor, w: Int8Parts) -> torch.Tensor:
    """x (..., in) -> x @ W (..., out) in x's dtype, W the int8 weight `w` stands for.

    On CPU without a W8A8 pack the bf16 rounding of x happens here, outside the op, so a compiled
    step fuses it into whatever produced x; eagerly it is the same single conversion the op would do.
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)  # (M, in)
    if w.kernel_scale is None:
        x2 = x2.to(torch.bfloat16)
    y = _OP(x2, w.q, w.scale, w.kernel_scale, w.use_kernel, w.packed, w.col_offsets, w.zero_bias, w.rowsum)  # (M, out)
    if w.packed is not None or w.rowsum is not None:  # the op left the scales to its caller
        y = y.mul_(w.kernel_scale)
    return y.to(x.dtype).view(*lead, w.out_features)  # (..., out)
