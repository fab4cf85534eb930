"""Why a decode step costs more than its weight GEMVs plus its small ops timed apart.

Two probes behind results-cpu.md's "Where the rest of a batch-1 decode step goes" section:

  1. cold ops: the time of one small op (and of our RMSNorm on one row) alone, and right after a
     GEMV that streams a 7 MB weight. The stream evicts the interpreter's and torch's dispatch
     working set from the core's 2 MB L2, so the next ops refill it.
  2. parts: one SmolLM2-135M-shaped decode step (batch 1, 128 cached tokens) with a timer around
     each part of every layer (norms, attention's pieces, MLP), summed per step.

    OMP_WAIT_POLICY=ACTIVE PYTHONPATH=. .venv/bin/python docs/benchmarks/cold_ops.py
"""
# ruff: noqa: E402

from __future__ import annotations

import collections
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # what `import engine` does, before torch starts

import torch

import engine.attention as model_code
from engine import Engine, decode_one_token, prefill
from engine.batching import build_batch
from engine.kv_pool import SeatPool


def median_us(op, before=None, n: int = 400) -> float:
    """Median microseconds of `op()`, each call preceded (untimed) by `before()` if given."""
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def cold_ops() -> None:
    weights = [torch.randn(576, 3072) for _ in range(8)]  # 7 MB each: more than a core's L2
    x, row, w = torch.randn(1, 576), torch.randn(1, 1, 576), torch.randn(576)
    turn = iter(range(10**9))

    def gemv() -> None:
        x @ weights[next(turn) % 8]  # (1, 576) @ (576, 3072)

    for name, op in (("x * 2", lambda: row * 2.0), ("rms_norm", lambda: model_code.rms_norm(row, w, 1e-5))):
        print(
            f"{name:9s} alone {median_us(op):6.1f} us   right after a 7 MB GEMV {median_us(op, gemv):6.1f} us"
        )


def timed(acc: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        acc[name] += time.perf_counter() - t0
        return out

    return wrapper


def decode_parts(prompt: int = 128, steps: int = 40) -> None:
    eng = Engine.load("preset:smollm2-135m")
    model, cfg, acc = eng.model, eng.cfg, collections.defaultdict(float)
    for blk in model.layers:
        blk.attn_norm.forward = timed(acc, "norms", blk.attn_norm.forward)
        blk.mlp_norm.forward = timed(acc, "norms", blk.mlp_norm.forward)
        blk.attn.forward = timed(acc, "attention block (all of it)", blk.attn.forward)
        blk.mlp.forward = timed(acc, "MLP (gate_up + down GEMVs, SwiGLU)", blk.mlp.forward)
    model_code.decode_attention = timed(acc, "  decode attention core", model_code.decode_attention)
    model_code.apply_rope = timed(acc, "  RoPE", model_code.apply_rope)
    slots = prompt + steps + 1
    pre = build_batch([[5] * prompt], "padded", torch.device("cpu"), slots)
    cache = SeatPool(cfg, 1, slots, model.dtype, "cpu")
    with torch.inference_mode():
        tok = prefill(model, pre, cache).argmax(-1)[:, None]  # (1, 1)
        valid, total = pre.valid.clone(), 0.0
        acc.clear()
        for i in range(steps):
            slot = prompt + i
            valid[:, slot] = True
            t0 = time.perf_counter()
            decode_one_token(
                model,
                tok,
                torch.tensor([[slot]]),
                torch.tensor([slot]),
                valid[:, None, None, : slot + 1],
                cache,
            )
            total += time.perf_counter() - t0
    for name, seconds in acc.items():
        print(f"{name:38s} {seconds / steps * 1e3:6.2f} ms per step")
    print(f"{'whole step':38s} {total / steps * 1e3:6.2f} ms")


if __name__ == "__main__":
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    )
    cold_ops()
    decode_parts()
