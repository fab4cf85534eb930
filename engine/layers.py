"""The pieces every layer is built from: RoPE, the norms, activations, and how weights are laid out.

engine/attention.py and engine/model.py build the layers out of these, and the compiled decode step
(engine/compiled.py) calls the same functions, so there is one definition of each piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig


@dataclass(frozen=True)
class Rope:
    cos: torch.Tensor  # (B, T, 1, D): broadcast over heads
    sin: torch.Tensor


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate each (i, i + D/2) pair of dims by angle position * inv_freq[i]. x: (B, T, H, D).

    HF writes it x cos + rotate_half(x) sin with rotate_half(x1, x2) = (-x2, x1). Our sin table
    already carries that minus sign on its first half, so the rotation is just a swap of halves:
    one op fewer per layer on the decode hot path, same numbers.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * rope.cos, torch.cat((x2, x1), dim=-1), rope.sin)  # x cos + rot(x) sin


def activation(name: str):
    if name == "silu":
        return F.silu
    if name == "gelu":
        return F.gelu
    return lambda x: F.gelu(x, approximate="tanh")  # gelu_new / gelu_pytorch_tanh


class Norm(nn.Module):
    """RMSNorm (Llama, Qwen2; computed in float32 like HF) or LayerNorm with bias (GPT-2)."""

    def __init__(self, cfg: ModelConfig, device, dtype):
        super().__init__()
        self.kind, self.eps, self.d = cfg.norm, cfg.norm_eps, cfg.d_model
        self.register_buffer("weight", torch.empty(cfg.d_model, device=device, dtype=dtype))
        bias = torch.empty(cfg.d_model, device=device, dtype=dtype) if cfg.norm == "layer" else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layer":
            return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, with the statistics in float32 as HF computes them.

    Written out rather than `F.rms_norm`, which was slower on CPU for prefill-sized activations and
    no faster for one decode row (docs/benchmarks/engine-choices.md). Half and bfloat16 inputs take
    HF's round trip through float32.
    """
    if x.dtype == torch.float32:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_buffer(module: nn.Module, name: str, shape, device, dtype, present: bool = True) -> None:
    module.register_buffer(name, torch.empty(shape, device=device, dtype=dtype) if present else None)


def add_weight(module: nn.Module, name: str, d_in: int, d_out: int, device, dtype) -> None:
    """A weight used as `x @ W_t`, shape (d_in, d_out); which way round its memory lies depends on dtype.

    float32 keeps (in, out) rows contiguous: MKL's fp32 GEMV is fastest that way on CPU.
    16-bit weights on CPU are stored (out, in), HF's layout, and `W_t` is a transposed view of
    it: the bf16/fp16 kernels (oneDNN) want that (docs/benchmarks/engine-choices.md has both
    measurements). Same values either way; loaders just copy_ in.
    """
    half_on_cpu = dtype in (torch.bfloat16, torch.float16) and torch.device(device).type == "cpu"
    if half_on_cpu:
        module.register_buffer(name, torch.empty(d_out, d_in, device=device, dtype=dtype).t())  # view
    else:
        module.register_buffer(name, torch.empty(d_in, d_out, device=device, dtype=dtype))
