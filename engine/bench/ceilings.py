"""Kernel ceilings: how fast the model's own matrix multiplies run with nothing else in between.

The roofline (engine/bench/roofline.py) says what the memory bus and the FPUs could do in principle. A
target can sit between that and what any real implementation reaches, because the GEMMs an
engine calls (MKL/oneDNN on CPU, cuBLAS on GPU) do not run these shapes at the roof. This module
measures that gap directly, on the weights the engine loaded:

  decode at batch B   `x @ W` for every layer's four weights (qkv, out, gate_up, down) and the LM
                      head, in the engine's order, with x of B rows: the weight-reading floor of
                      one decode step with these kernels. Norms, RoPE, decode attention and the
                      Python between ops are left out, so the real step can only be slower.
  prefill of T tokens the four layer GEMMs with T rows, the LM head with ONE row (the engine asks
                      logits for the last position only) and the causal attention kernel the
                      engine calls (SDPA), per layer: elementwise work and the cache writes left out.

On CPU the same two chains also run through the native step's own products (engine/native_step.c),
the kernels the engine's default calls there: `native_decode_step_s` and `native_prefill_gemm_s`.

Each chain is timed `repeats` times after a warm-up and the median kept. A chain streams 400+ MB of
distinct weights for a 135M model, so the matrices come from DRAM, as in a real step (a single
matrix timed in a loop would sit in the cache and flatter the kernel).

Worked example (SmolLM2-135M, fp32, 2 CPU threads): if the batch-1 chain takes 29 ms and HF's TPOT
is 51 ms, no engine built on these kernels can show a TPOT ratio under 0.57, so a 0.5 target needs
faster kernels, not less overhead.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from engine import native_build, native_ops
from engine.bench.roofline import synchronize
from engine.model import Transformer
from engine.quant import Int8Weight, matmul


def layer_weights(model: Transformer) -> list:
    """Every layer's weights as the engine multiplies by them, in call order: `(in, out)` float
    tensors, or engine.quant.Int8Weight modules (same `.shape`) when the model was loaded int8."""
    out = []
    for block in model.layers:
        out += [block.attn.wqkv_t, block.attn.wo_t, block.mlp.w_up_t, block.mlp.w_down_t]
    return out


def time_chain(fn, device: torch.device, repeats: int) -> float:
    """Median wall seconds of `fn()` over `repeats` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_chain(model: Transformer, rows: int, head_rows: int):
    """A function that runs `x @ W` for every weight (x: `rows` rows; the LM head: `head_rows`),
    through the same `engine.quant.matmul` the model calls (so int8 weights use their kernels)."""
    weights, head, dev, dt = layer_weights(model), model.lm_head_t, model.device, model.dtype
    inputs = {
        w.shape[0]: torch.randn(rows, w.shape[0], device=dev, dtype=dt) for w in weights
    }  # one (rows, in) activation per input width
    x_head = torch.randn(head_rows, head.shape[0], device=dev, dtype=dt)

    def run() -> None:
        for w in weights:
            matmul(inputs[w.shape[0]], w)  # (rows, in) @ (in, out)
        matmul(x_head, head)  # (head_rows, d) @ (d, V)

    return run


def native_chain(model: Transformer, rows: int, head_rows: int | None = None):
    """A function that runs the native step's own float32 products (engine/native_step.c) over every
    weight with x of `rows` rows, and the LM head with `head_rows` (default `rows`); None where they
    are not built or the weights are not float32 on CPU (int8 products already run natively through
    `matmul`)."""
    weights = layer_weights(model) + [model.lm_head_t]
    if not native_build.ready() or model.dtype != torch.float32 or model.device.type != "cpu" \
            or any(isinstance(w, Int8Weight) for w in weights):  # fmt: skip
        return None
    x = torch.randn(rows, max(w.shape[0] for w in weights))  # (rows, widest in)
    xs = {w.shape[0]: x[:, : w.shape[0]].contiguous() for w in weights}  # (rows, in) per input width
    y = torch.empty(rows * max(w.shape[1] for w in weights))
    heads = rows if head_rows is None else head_rows
    calls = []  # each product checked against the contract once, here, not inside the timing
    for w in weights:
        n = heads if w is weights[-1] else rows
        calls.append(native_ops.prepare_product(xs[w.shape[0]][:n], w, y[: n * w.shape[1]].view(n, w.shape[1])))

    def run() -> None:
        for call in calls:
            call()

    return run


def attention_chain(model: Transformer, tokens: int, batch: int = 1):
    """A function that runs the engine's prefill attention kernel once per layer on B x T tokens."""
    cfg, dev, dt = model.cfg, model.device, model.dtype
    q = torch.randn(batch, cfg.n_heads, tokens, cfg.head_dim, device=dev, dtype=dt)  # (B, H, T, D)
    k = torch.randn(batch, cfg.n_kv_heads, tokens, cfg.head_dim, device=dev, dtype=dt)  # (B, Hkv, T, D)
    v = torch.randn_like(k)

    def run() -> None:
        for _ in range(cfg.n_layers):
            F.scaled_dot_product_attention(q, k, v, is_causal=tokens > 1, enable_gqa=cfg.group > 1)

    return run


def measure_ceilings(model: Transformer, prefill_tokens: int, batches: tuple[int, ...], repeats: int,
                     prefill_batch: int = 1) -> dict:  # fmt: skip
    """Seconds of the kernel-only chains: prefill of `prefill_batch` x `prefill_tokens` (GEMMs with
    B x T rows, the LM head with B rows, attention per sequence) and decode per batch size."""
    dev = model.device
    with torch.inference_mode():
        gemm = time_chain(matmul_chain(model, prefill_batch * prefill_tokens, prefill_batch), dev, repeats)
        attn = time_chain(attention_chain(model, prefill_tokens, prefill_batch), dev, repeats)
        decode = {
            f"b{b}": time_chain(matmul_chain(model, b, b), dev, repeats) for b in batches
        }  # seconds per step
        chains = {b: native_chain(model, b) for b in batches}
        native = {f"b{b}": time_chain(fn, dev, repeats) for b, fn in chains.items() if fn is not None}
        prefill_chain = native_chain(model, prefill_batch * prefill_tokens, prefill_batch)
        native_prefill = None if prefill_chain is None else time_chain(prefill_chain, dev, repeats)
    return {
        "method": "the model's own weights through x @ W (and SDPA for prefill), nothing else; "
        f"median of {repeats} after a warm-up",
        "prefill_tokens": prefill_tokens,
        "prefill_batch": prefill_batch,
        "prefill_gemm_s": gemm,
        "prefill_attention_s": attn,
        "prefill_s": gemm + attn,
        "decode_step_s": decode,
        "native_decode_step_s": native,  # the native step's float32 products alone; {} where they do not run
        "native_prefill_gemm_s": native_prefill,  # the same for the prefill's rows; None where they do not run
    }
