"""The int8 weight product as one opaque op, `torch.ops.twopot.int8_matmul`: eager and compiled alike.

Why an op of its own: inside `torch.compile`, a call into C through ctypes, or a loop over a
weight's chunks, would break the graph. As one op with a known output shape and dtype
(`register_fake`) the compiler sees a single call and fuses everything around it (the norm before
it, the residual add after it).

One code path: `engine.quant.matmul` calls `int8_product` for every int8 weight, eagerly (the
`Int8Weight` module, through its `Int8Parts`), in the eager and the compiled decode step alike.

The arithmetic is one rule wherever it runs (engine/native_int8.h states it): the weight's int8
values q (out, in) with a float16 scale per 32 inputs, and the activations rounded to 8 bits over
each block of 32 inputs at run time (W8A8 in Q8_0's blocks). The LM head refines (`refine`): its
rounding error lands on the logits directly, with no later layer to average it out, so its input is
rounded twice, to 8 bits and then what that missed to 8 bits as well, and each row's REFINE_TOP
largest logits get the remainder's product added: the top of the distribution, which sampling and
a KL divergence depend on, sees the input to about 16 bits, for 64 of the vocabulary's 49,152 rows
of the assistant's weight (docs/benchmarks/int8-cpu.md measures what each costs). By where it runs:
  * on a CPU where the engine's own kernels are built (engine/native_build.py): the native
    product, any number of rows, the same bits the native step gives a row (native_ops.py);
  * elsewhere (a CPU without a C compiler, CUDA): the same rounding of the activations in torch
    (`round_blocks`), then a float32 product with the weight dequantized chunk by chunk
    (`dequantize`: exact, an 8-bit value times a float16-precision scale fits float32's
    significand). It differs from the native product only in the order float32 sums its terms.
The result is float32; `int8_product` returns it in the input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import native_ops
from engine.native_ops import QBLOCK, blocks

QMAX = 127  # symmetric: -127..127, so -q is always representable (the VNNI kernel negates weight bytes)
DEQUANT_ROWS = 4096  # weight rows dequantized at a time off the native path: bounds the float copy
REFINE_TOP = 64  # the LM head's largest outputs per row refined: native_refine.h's own (the ties test holds them equal)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q (out, in) int8, scale (out, blocks(in)) float16 -> the weight (out, in) float32, q x its block's scale."""
    out, width = q.shape
    pad = blocks(width) * QBLOCK - width
    wide = torch.nn.functional.pad(q.float(), (0, pad)).view(out, -1, QBLOCK)  # (out, G, 32)
    return (wide * scale.float().unsqueeze(-1)).view(out, -1)[:, :width]  # (out, in)


def round_blocks(x: torch.Tensor) -> torch.Tensor:
    """x (M, in) float32 -> its values after rounding to 8 bits block by block, as the native kernel
    does: s = max|x| over the block / 127, round(x / s) ties to even, times s (an all-zero block stays 0)."""
    M, width = x.shape
    pad = blocks(width) * QBLOCK - width
    xb = torch.nn.functional.pad(x, (0, pad)).view(M, -1, QBLOCK)  # (M, G, 32)
    s = xb.abs().amax(-1, keepdim=True) / QMAX  # (M, G, 1)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(xb / safe).clamp_(-QMAX, QMAX)
    return (q * s).view(M, -1)[:, :width]  # (M, in)


def top_outputs(y: torch.Tensor) -> torch.Tensor:
    """(M, out) -> (M, n) the indices of each row's n = min(REFINE_TOP, out) largest values, ties to
    the lower index (a stable sort keeps equal values in index order), as native_refine.h picks them."""
    return torch.sort(y, dim=1, descending=True, stable=True).indices[:, :REFINE_TOP]


def emulated_product(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, refine: bool = False) -> torch.Tensor:
    """x (M, in) -> (M, out) float32 by the rule, in torch: rounded activations times the dequantized
    weight, DEQUANT_ROWS output channels at a time. `refine`: then each row's REFINE_TOP largest
    outputs plus what the rounding missed, rounded in turn, times their rows of the weight."""
    x = x.float()
    xr = round_blocks(x)  # (M, in)
    y = x.new_empty((x.shape[0], q.shape[0]), dtype=torch.float32)  # (M, out)
    for n0 in range(0, q.shape[0], DEQUANT_ROWS):
        n1 = min(n0 + DEQUANT_ROWS, q.shape[0])
        y[:, n0:n1] = xr @ dequantize(q[n0:n1], scale[n0:n1]).t()
    if refine:
        lo = round_blocks(x - xr)  # (M, in) the remainder, rounded
        for m, top in enumerate(top_outputs(y)):
            y[m, top] += dequantize(q[top], scale[top]) @ lo[m]  # (n,)
    return y


@dataclass(frozen=True)
class Int8Parts:
    """What one int8 product needs, as tensors and constants (a compiled function takes these, not
    an nn.Module, whose identity the compiler would guard on).

    q (out, in) int8, contiguous; scale (out, blocks(in)) float16; native: the engine's own kernel
    serves this weight (CPU, built); refine: its input is rounded twice (the LM head)."""

    q: torch.Tensor
    scale: torch.Tensor
    in_features: int
    out_features: int
    native: bool
    refine: bool = False


@torch.library.custom_op("twopot::int8_matmul", mutates_args=())
def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, native: bool, refine: bool) -> torch.Tensor:
    """x (M, in) float32 -> x @ W^T (M, out) float32, W the weight (q, scale) stands for, by the rule."""
    if native:
        return native_ops.int8_product(x, q, scale, refine)
    return emulated_product(x, q, scale, refine)


@int8_matmul.register_fake
def _(x, q, scale, native, refine):
    return x.new_empty((x.shape[0], q.shape[0]), dtype=torch.float32)  # (M, out)


_OP = torch.ops.twopot.int8_matmul.default  # the dispatcher's entry: a few microseconds less per call


def int8_product(x: torch.Tensor, w: Int8Parts) -> torch.Tensor:
    """x (..., in) -> x @ W (..., out) in x's dtype, W the int8 weight `w` stands for."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features).float()  # (M, in)
    y = _OP(x2, w.q, w.scale, w.native, w.refine)  # (M, out) float32
    return y.to(x.dtype).view(*lead, w.out_features)  # (..., out)
