"""Smaller portions: int8 quantization of the model's matmul weights.

Why: a batch-1 decode step reads every weight once and does two FLOPs per weight, so its time is
the bytes it reads. Storing the weights as int8 (one byte each, plus a float16 scale per 32
weights: 1.0625 bytes a weight, Q8_0's size) instead of float32 (four) cuts those bytes by 3.76x. Prefill is compute-bound and gains nothing
from fewer bytes.

What is quantized: every `x @ W` weight of the network -- the fused q|k|v and out projections,
the fused gate|up and down projections of the MLP, and the LM head. The embedding table stays in
the model's dtype: a token's embedding is one gathered row, not a matmul, so shrinking it saves
no time per step. For tied models (one matrix for both) the embedding keeps its own float copy.

The numbers: llama.cpp's Q8_0 blocks, symmetric, no zero point. Each output channel's row is cut
into blocks of QBLOCK = 32 consecutive inputs (the last may be shorter), and each block g has its
own scale:
    d = max_k |W[n, k]| / 127 over the block,   q[n, k] = round(W[n, k] / d) (ties away from zero),
    scale[n, g] = d rounded to float16,          W[n, k] ~= q[n, k] * scale[n, g],  q in [-127, 127]
exactly as ggml and the gguf library quantize a Q8_0 tensor, so our int8 of a float32 model is
llama.cpp's Q8_0 of it, value for value and scale for scale, and a Q8_0 GGUF loads into these
buffers as it is (`Int8Weight(blocks=...)`, engine/gguf.py `int8_blocks`). The activations of every
product are rounded to 8 bits per 32-wide block too, at run time (engine/int8_op.py,
engine/native_int8.h): one range per whole row let a model's few outlier features coarsen every
other input of the row (docs/benchmarks/int8-cpu.md has the measurements that chose blocks). The LM
head's input is rounded twice (`refine`: to 8 bits, then the remainder to 8 bits), because its
error lands on the logits with nothing after it to average it out.
Norms, RoPE, attention, the KV cache and the residual stream keep the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine import native_build
from engine.errors import EngineError
from engine.int8_op import QMAX, Int8Parts, dequantize, int8_product
from engine.native_ops import QBLOCK, blocks

QUANT_MODES = ("int8",)
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


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) float -> (q (out, in) int8, scale (out, blocks(in)) float16), Q8_0's rounding.

    Worked example, one block: max |w| = 0.254, so d = 0.002 and w = 0.1 becomes q = 50; the scale
    stored is d in float16 (0.0019998550415039062), and q x scale = 0.09999 is what the products use."""
    out, width = w.shape
    pad = blocks(width) * QBLOCK - width
    wb = nn.functional.pad(w.float(), (0, pad)).view(out, -1, QBLOCK)  # (out, G, 32)
    d = wb.abs().amax(-1, keepdim=True) / QMAX  # (out, G, 1) float32
    v = wb * torch.where(d == 0, torch.zeros_like(d), 1 / d)  # |v| <= 127
    a = v.abs()
    whole = a.floor()
    q = (whole + (2 * (a - whole)).floor()).copysign(v)  # round half away from zero, exactly (as gguf's)
    q = q.view(out, -1)[:, :width].to(torch.int8)
    return q.contiguous(), d.squeeze(-1).half()


class Int8Weight(nn.Module):
    """A weight used as `x @ W_t` (W_t of shape (in, out)), stored as int8 rows with a scale per 32 inputs.

    Made from the float weight (`Int8Weight(w_t)`, quantized here) or from int8 blocks as they are
    (`Int8Weight(blocks=(q, scale))`: a Q8_0 GGUF's; a float32 scale is rounded to float16). Buffers:
    `q` (out, in) int8, contiguous (the kernels read each output channel's row); `scale`
    (out, blocks(in)) float16.
    `native`: the engine's own int8 kernel (engine/native_build.py) serves it: on CPU, where built.
    `refine`: its input is rounded to 8 bits twice (engine/int8_op.py): the LM head's.
    """

    def __init__(self, w_t: torch.Tensor | None = None, blocks: tuple[torch.Tensor, torch.Tensor] | None = None,
                 refine: bool = False):  # fmt: skip
        super().__init__()
        q, scale = quantize_blocks(w_t.t()) if blocks is None else blocks
        want = (q.shape[0], -(-q.shape[1] // QBLOCK))
        if q.dtype != torch.int8 or q.dim() != 2 or tuple(scale.shape) != want or (q.numel() and int(q.min()) < -QMAX):
            raise EngineError(f"int8 blocks: q {q.dtype} {tuple(q.shape)} with scale {tuple(scale.shape)}; want int8 "
                              f"values in -127..127 and a scale per {QBLOCK} inputs {want}")  # fmt: skip
        self.register_buffer("q", q.contiguous())
        self.register_buffer("scale", scale.half().contiguous())
        self.out_features, self.in_features = q.shape
        self.native = q.device.type == "cpu" and native_build.ready()
        self.refine = refine

    @property
    def shape(self) -> tuple[int, int]:
        """(in, out), like the float weight it replaces (cost models and ceilings read it)."""
        return self.in_features, self.out_features

    def dequantized(self) -> torch.Tensor:
        """The weight the products use, (in, out) float32 like the float weight it replaces."""
        return dequantize(self.q, self.scale).t()

    def parts(self) -> Int8Parts:
        """The current buffers and constants, as the op (engine/int8_op.py) and a compiled step take them."""
        return Int8Parts(self.q, self.scale, self.in_features, self.out_features, self.native, self.refine)

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


def _replace(module: nn.Module, name: str, blocks: tuple[torch.Tensor, torch.Tensor] | None,
             refine: bool = False) -> tuple[int, int]:  # fmt: skip
    w_t = module._buffers.pop(name)  # (in, out) float
    qw = Int8Weight(w_t, blocks=None if blocks is None else tuple(t.to(w_t.device) for t in blocks), refine=refine)
    setattr(module, name, qw)  # a submodule now: named_buffers() reports q and scale
    return w_t.numel() * w_t.element_size(), qw.q.numel() + qw.scale.numel() * qw.scale.element_size()


def quantize(model: nn.Module, mode: str = "int8", exact: dict | None = None) -> QuantReport:
    """Replace every matmul weight of an engine.model.Transformer by an Int8Weight, in place.

    `exact`: int8 blocks to take as they are, by buffer name ("layers.0.attn.wqkv_t" -> (q, scale),
    a Q8_0 GGUF's: engine/gguf.py `int8_blocks`); every other weight is quantized here.
    A tied model first gets its own float embedding table (the LM head matrix, transposed), so
    embedding a token still gathers exact float rows.
    """
    parse_quant(mode)
    exact = exact or {}
    before = after = 0
    if model.embed is None:  # tied: the (d, V) head doubled as the embedding table
        model.embed = model.lm_head_t.t().contiguous()  # (V, d), model dtype
        after += model.embed.numel() * model.embed.element_size()
    count = 0
    for i, block in enumerate(model.layers):
        for module, name, path in ((block.attn, "wqkv_t", "attn"), (block.attn, "wo_t", "attn"),
                                   (block.mlp, "w_up_t", "mlp"), (block.mlp, "w_down_t", "mlp")):  # fmt: skip
            b, a = _replace(module, name, exact.get(f"layers.{i}.{path}.{name}"))
            before, after, count = before + b, after + a, count + 1
    b, a = _replace(model, "lm_head_t", exact.get("lm_head_t"), refine=True)  # its input rounded twice
    return QuantReport(mode, count + 1, before + b, after + a)
