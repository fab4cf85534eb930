"""The int8 weight product as one opaque op, `torch.ops.twopot.int8_matmul`: eager and compiled alike.

Why an op of its own: the CPU int8 kernel (`aten._weight_int8pack_mm`) loads its activations with
64-byte aligned loads, so its caller must look at `data_ptr()` and copy a misaligned input first.
Inside `torch.compile` that check is a graph break, and inductor's buffer reuse promises no
alignment, so int8 models used to decode eagerly. Wrapped in a `torch.library.custom_op`, the check
and the kernel choice run inside the op at run time, where the real pointer is known; the compiler
sees one call with a known output shape (`register_fake`) and fuses everything around it (the
norm before it, the bf16 rounding of its input, the residual add after it).

One code path: `engine.quant.matmul` calls `int8_product` for every int8 weight, eagerly (the
`Int8Weight` module, through its `Int8Parts`), in the eager and the compiled decode step alike. The
arithmetic is exactly what `Int8Weight.forward` did before the op existed (tests/test_quant.py
checks bit-equality): bfloat16 activations, float32 sums, a bfloat16 result, then x's dtype.

Which kernel, per call (the numbers: docs/benchmarks/int8-cpu.md):
  * at most KERNEL_MAX_ROWS rows and a usable kernel: `_weight_int8pack_mm` reads the int8 weight
    directly (bfloat16 activations and scales on CPU; float32 on CUDA);
  * otherwise the weight is widened to bfloat16 (exact: |q| <= 127) for torch's bfloat16 GEMM.
The row count may be a symbol of the compiled graph; the output's dtype never depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KERNEL_MAX_ROWS = 8  # up to this many rows the int8 kernel beat a bf16 GEMM on widened weights (int8-cpu.md)
KERNEL_WIDTH_MULTIPLE = 16  # the CPU kernel's aligned loads need the input width in multiples of this
KERNEL_ALIGN = 64  # bytes: the CPU kernel's aligned loads need its input to start on such a boundary


@dataclass(frozen=True)
class Int8Parts:
    """What one int8 product needs, as tensors and constants (a compiled function takes these, not
    an nn.Module, whose identity the compiler would guard on).

    q (out, in) int8, contiguous; scale (out,) bfloat16; kernel_scale (out,) float32 on CUDA where
    the kernel takes float32, None on CPU; use_kernel: the int8 kernel works here for this width.
    """

    q: torch.Tensor
    scale: torch.Tensor
    kernel_scale: torch.Tensor | None
    use_kernel: bool
    in_features: int
    out_features: int


def result_dtype(kernel_scale: torch.Tensor | None) -> torch.dtype:
    """The op's output dtype: bfloat16, or the CUDA kernel's float32 (a bf16 result widens exactly)."""
    return torch.bfloat16 if kernel_scale is None else kernel_scale.dtype


@torch.library.custom_op("twopot::int8_matmul", mutates_args=())
def int8_matmul(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, kernel_scale: torch.Tensor | None, use_kernel: bool
) -> torch.Tensor:
    """x (M, in) -> x @ (q * scale)^T (M, out) in `result_dtype(kernel_scale)`.

    x in any float dtype: rounded to bfloat16 here unless it already is (the caller rounds on CPU,
    so a compiler can fuse the rounding into the op that made x); on CUDA's kernel path x goes to
    the kernel in float32 instead, unrounded.
    """
    out_dtype = result_dtype(kernel_scale)
    if use_kernel and x.shape[0] <= KERNEL_MAX_ROWS:
        if kernel_scale is not None:  # CUDA: float32 activations and scales
            xk = x.to(kernel_scale.dtype).contiguous()  # (M, in)
            return torch.ops.aten._weight_int8pack_mm(xk, q, kernel_scale)  # (M, out)
        x2 = x.to(torch.bfloat16)  # (M, in); x itself when the caller rounded
        if x2.data_ptr() % KERNEL_ALIGN or not x2.is_contiguous():  # aligned loads: a fresh, packed buffer
            x2 = x2.clone(memory_format=torch.contiguous_format)
        return torch.ops.aten._weight_int8pack_mm(x2, q, scale)  # (M, out) bf16
    y = (x.to(torch.bfloat16) @ q.t().to(torch.bfloat16)).mul_(scale)  # (M, out) bf16; widening is exact
    return y if y.dtype == out_dtype else y.to(out_dtype)


@int8_matmul.register_fake
def _(x, q, scale, kernel_scale, use_kernel):
    return x.new_empty((x.shape[0], q.shape[0]), dtype=result_dtype(kernel_scale))  # (M, out)


_OP = torch.ops.twopot.int8_matmul.default  # the dispatcher's entry: a few microseconds less per call


def int8_product(x: torch.Tensor, w: Int8Parts) -> torch.Tensor:
    """x (..., in) -> x @ W (..., out) in x's dtype, W the int8 weight `w` stands for.

    On CPU the bf16 rounding of x happens here, outside the op, so a compiled step fuses it into
    whatever produced x; eagerly it is the same single conversion the op would do.
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)  # (M, in)
    if w.kernel_scale is None:
        x2 = x2.to(torch.bfloat16)
    y = _OP(x2, w.q, w.scale, w.kernel_scale, w.use_kernel)  # (M, out)
    return y.to(x.dtype).view(*lead, w.out_features)  # (..., out)
