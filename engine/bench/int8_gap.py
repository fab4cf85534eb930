"""`python -m engine.bench.int8_gap [--model M] [--windows N] [--out FILE]`: where our int8 differs from its own rule.

Why: `engine bench int8-quality` measures the engine's int8 kernels (the native step) against
float32, and `engine.bench.int8_causes` measures the same rounding rule multiplied in float32 (no
kernels); when their figures differ, either a kernel does something the rule does not, or the two
runs merely round differently somewhere and the figures differ by chance. This bench tells which:
  1. op by op, on the same inputs: every int8 product of the model's forward runs the kernel
     (engine/native_ops.py) and the rule in torch (engine/int8_op.py `emulated_product`) on the very
     same activations, and the largest difference of each kind of product is recorded, relative to
     the largest output of that product;
  2. pass by pass, against float32 as llama.cpp measures its quants (engine/fidelity.py), on the same
     windows as int8-quality: the native step (the bench's figure), the model's forward with the
     kernel products, the rule in float32 (int8_causes' row), and the rule with each product summed in
     float64 -- the same rounding and only the summation's last bits changed, which says how far the
     figures move when nothing but float rounding differs; last, that float64 rule with the LM
     head's input left unrounded, what rounding that one product's activations costs.
Worked example of reading it: if every product's kernel differs from the rule by ~1e-7 of its range
while the float32 and float64 sums of the one rule give KL 0.0038 and 0.0040, a 3 % difference
between two implementations of the rule is within what float rounding alone moves the figure.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import asdict

import psutil
import torch

from engine import Engine
from engine import attention as attention_module
from engine import model as model_module
from engine.bench.contestants import machine_facts
from engine.bench.int8_causes import (
    rounded_input,
    rounded_products,
    rounded_weight,
    text_windows,
    write_report,
)
from engine.bench.int8_quality import DEFAULT_TEXT, QualityPlan
from engine.fidelity import FidelityMeter, scored_rows, window_logits
from engine.int8_op import emulated_product
from engine.native_ops import int8_product
from engine.quant import Int8Weight


def forward_logits(eng: Engine, ids: list[int], rows: list[int]) -> torch.Tensor:
    """Logits (len(rows), V) of the model's forward op by op (never the native step)."""
    with torch.inference_mode():
        tokens = torch.tensor([ids])  # (1, T)
        return eng.model(tokens, torch.arange(len(ids)).unsqueeze(0))[0, rows].float()  # (R, V)


def product_names(model) -> dict[int, str]:
    """id(weight) -> its kind ("qkv", "out", "up", "down", "lm_head"), for the op-by-op table."""
    names = {id(model.lm_head_t): "lm_head"}
    for b in model.layers:
        kinds = ((b.attn.wqkv_t, "qkv"), (b.attn.wo_t, "out"), (b.mlp.w_up_t, "up"), (b.mlp.w_down_t, "down"))
        names |= {id(w): name for w, name in kinds}
    return names


@contextlib.contextmanager
def compared_products(model, table: dict[str, dict]):
    """Every int8 product of `model`'s forward runs the kernel and the rule in torch on the same x;
    the kernel's result goes on, and `table[kind]` keeps the largest |kernel - rule| / max |rule|."""
    names, plain = product_names(model), model_module.matmul

    def product(x: torch.Tensor, w) -> torch.Tensor:
        if not isinstance(w, Int8Weight):
            return plain(x, w)
        x2 = x.reshape(-1, w.in_features).float().contiguous()  # (M, in)
        kernel, rule = int8_product(x2, w.q, w.scale), emulated_product(x2, w.q, w.scale)  # (M, out) each
        row = table.setdefault(names[id(w)], {"calls": 0, "max_rel": 0.0, "max_abs": 0.0})
        diff = float((kernel - rule).abs().max())
        row["calls"] += 1
        row["max_abs"] = max(row["max_abs"], diff)
        row["max_rel"] = max(row["max_rel"], diff / max(float(rule.abs().max()), 1e-30))
        return kernel.to(x.dtype).view(*x.shape[:-1], w.out_features)  # (..., out)

    model_module.matmul = attention_module.matmul = product
    try:
        yield
    finally:
        model_module.matmul = attention_module.matmul = plain


@contextlib.contextmanager
def float64_rule(model, exact_input: str | None = None):
    """The rule of int8_causes' "32, 32" row, each product summed in float64 and rounded once to
    float32. `exact_input`: the kind of product ("lm_head", ...) whose activations stay unrounded,
    what rounding them costs."""
    cache: dict[int, torch.Tensor] = {}
    names, plain = product_names(model), model_module.matmul

    def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if id(w) not in cache:
            cache[id(w)] = rounded_weight(w, "32").double()  # (in, out)
        xr = x if names[id(w)] == exact_input else rounded_input(x, "32")
        return (xr.double() @ cache[id(w)]).to(x.dtype)

    model_module.matmul = attention_module.matmul = product
    try:
        yield
    finally:
        model_module.matmul = attention_module.matmul = plain


def summary(meter: FidelityMeter) -> dict:
    fid = meter.result()
    return asdict(fid) | {"ppl_ratio": fid.ppl_ratio}


def gap(model: str, windows: list[list[int]], progress) -> dict:
    f32_op = Engine.load(model, native=False)  # float32, the model's forward (int8_causes' reference)
    f32_native = Engine.load(model)  # float32, the native step (int8-quality's reference)
    int8 = Engine.load(model, quant="int8")  # the native step's int8 (int8-quality's figure)
    assert int8.native is not None and int8.native.ready and f32_native.native.ready
    runs = ("native step", "forward, kernel products", "rule, float32 sums", "rule, float64 sums",
            "rule, float64 sums, LM head input unrounded")  # fmt: skip
    meters = {(run, ref): FidelityMeter() for run in runs for ref in ("forward", "native")}
    apart = {run: FidelityMeter() for run in runs[1:]}  # each run against the native step itself
    ops: dict[str, dict] = {}
    per_window: dict[str, list[float]] = {}
    for i, ids in enumerate(windows):
        rows = scored_rows(len(ids))
        targets = torch.tensor([ids[r + 1] for r in rows])  # (N,)
        refs = {"forward": forward_logits(f32_op, ids, rows), "native": window_logits(f32_native, ids, rows)}
        logits = {"native step": window_logits(int8, ids, rows)}
        with compared_products(int8.model, ops):
            logits["forward, kernel products"] = forward_logits(int8, ids, rows)
        with rounded_products("32", "32"):
            logits["rule, float32 sums"] = forward_logits(f32_op, ids, rows)
        with float64_rule(f32_op.model):
            logits["rule, float64 sums"] = forward_logits(f32_op, ids, rows)
        with float64_rule(f32_op.model, "lm_head"):
            logits[runs[-1]] = forward_logits(f32_op, ids, rows)
        for (run, ref), meter in meters.items():
            meter.add(refs[ref], logits[run], targets)
        for run in runs:  # each window's mean KL against the native float32 pass, to see the spread
            one = FidelityMeter()
            one.add(refs["native"], logits[run], targets)
            per_window.setdefault(run, []).append(one.result().kl_mean)
        for run, meter in apart.items():
            meter.add(logits["native step"], logits[run], targets)
        progress(f"window {i + 1}/{len(windows)}: " + ", ".join(f"{r} KL {meters[(r, 'native')].result().kl_mean:.5f}"
                                                                for r in runs))  # fmt: skip
    return {"against_float32": [{"run": run, "reference": ref, **summary(m)} for (run, ref), m in meters.items()],
            "against_native_step": [{"run": run, **summary(m)} for run, m in apart.items()],
            "products": ops, "kl_mean_per_window": per_window}  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.int8_gap", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="assistant")
    p.add_argument("--text", default=str(DEFAULT_TEXT))
    p.add_argument("--windows", type=int, default=QualityPlan.chunks, help="512-token windows (default 8)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    plan = QualityPlan()
    torch.set_num_threads(plan.threads)
    t0, load0 = time.perf_counter(), psutil.getloadavg()
    windows = text_windows(args.model, args.text, plan.ctx, args.windows)
    report = {"model": args.model, "text": args.text, "windows": len(windows), "ctx": plan.ctx,
              **gap(args.model, windows, lambda m: print(m, file=sys.stderr, flush=True)),
              "machine": machine_facts(), "loadavg_start": load0, "loadavg_end": psutil.getloadavg(),
              "elapsed_s": time.perf_counter() - t0, "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
