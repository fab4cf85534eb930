"""`python -m engine.bench.int8_causes [--model M] [--text FILE] [--out FILE]`: which rounding costs int8 its fidelity.

Why: int8 rounds two things, the weights (once, at load) and each product's activations (every
call), and each can share one scale over a whole row or over blocks of 32 inputs. This bench
rounds them each way in float32 -- the values the kernels would multiply, without the kernels --
and measures every combination against float32 as llama.cpp measures its quants
(engine/fidelity.py), on the same windows of text as `python -m engine bench int8-quality`:
  weights   "channel": one scale per output channel (max |row| / 127, rounded to bfloat16)
            "32": Q8_0's blocks (engine/quant.py `quantize_blocks`)
  activations "none" (float32), "row" (one range per row), "32" (one range per 32-wide block)
The model's forward runs op by op with every weight product replaced by the rounded one; nothing
else changes. Worked example of reading it: if "channel, row" has KL 0.035 and "channel, none"
0.004, rounding activations over whole rows is most of int8's loss.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict

import torch

from engine import Engine
from engine import attention as attention_module
from engine import model as model_module
from engine.bench.int8_quality import DEFAULT_TEXT, QualityPlan
from engine.fidelity import FidelityMeter, scored_rows, window_logits
from engine.int8_op import QMAX, dequantize, round_blocks
from engine.quant import quantize_blocks

RULES = (("channel", "row"), ("channel", "none"), ("32", "none"), ("32", "row"), ("channel", "32"), ("32", "32"))


def rounded_weight(w_t: torch.Tensor, rule: str) -> torch.Tensor:
    """w_t (in, out) -> the float32 values an int8 weight of this rule multiplies by, (in, out)."""
    w = w_t.t().float()  # (out, in)
    if rule == "32":
        return dequantize(*quantize_blocks(w)).t()
    scale = (w.abs().amax(1, keepdim=True) / QMAX).clamp(min=torch.finfo(torch.bfloat16).tiny).bfloat16().float()
    return (torch.round(w / scale).clamp(-QMAX, QMAX) * scale).t()  # (in, out)


def rounded_input(x: torch.Tensor, rule: str) -> torch.Tensor:
    """x (..., in) -> its values after this rule's rounding to 8 bits."""
    if rule == "none":
        return x
    flat = x.reshape(-1, x.shape[-1]).float()  # (M, in)
    if rule == "32":
        return round_blocks(flat).view(x.shape)
    s = flat.abs().amax(1, keepdim=True) / QMAX  # (M, 1)
    return (torch.round(flat / torch.where(s > 0, s, torch.ones_like(s))).clamp(-QMAX, QMAX) * s).view(x.shape)


@contextlib.contextmanager
def rounded_products(weights: str, inputs: str):
    """Every weight product of the model's forward (engine/model.py and engine/attention.py call
    `matmul`) as `rounded_input(x) @ rounded_weight(W)` while inside; each weight rounded once."""
    cache: dict[int, torch.Tensor] = {}
    plain = model_module.matmul

    def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if id(w) not in cache:
            cache[id(w)] = rounded_weight(w, weights)
        return rounded_input(x, inputs) @ cache[id(w)]

    model_module.matmul = attention_module.matmul = product
    try:
        yield
    finally:
        model_module.matmul = attention_module.matmul = plain


def causes(model: str, windows: list[list[int]], progress) -> list[dict]:
    eng = Engine.load(model, native=False)  # the model's forward, whose products are swapped below
    assert eng.native is None or not eng.native.ready
    refs = [window_logits(eng, ids, scored_rows(len(ids))) for ids in windows]  # float32, once
    rows = []
    for weights, inputs in RULES:
        meter = FidelityMeter()
        with rounded_products(weights, inputs):
            for ids, ref in zip(windows, refs, strict=True):
                scored = scored_rows(len(ids))
                meter.add(ref, window_logits(eng, ids, scored), torch.tensor([ids[r + 1] for r in scored]))
        fid = meter.result()
        progress(f"weights {weights}, activations {inputs}: KL {fid.kl_mean:.5f}, top-1 {100 * fid.top1:.2f} %")
        rows.append({"weights": weights, "activations": inputs, **asdict(fid), "ppl_ratio": fid.ppl_ratio})
    return rows


def text_windows(model: str, text: str, ctx: int, count: int) -> list[list[int]]:
    """int8-quality's windows of `ctx` tokens, as our tokenizer splits the text (the same ids llama.cpp evaluated)."""
    ids = Engine.load(model, native=False).encode(open(text).read())[: ctx * count]
    return [ids[i : i + ctx] for i in range(0, len(ids) - ctx + 1, ctx)]


def write_report(report: dict, out: str | None) -> None:
    """The report as JSON on stdout, and in `out` when given."""
    text = json.dumps(report, indent=1)
    if out:
        open(out, "w").write(text + "\n")
    print(text)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.int8_causes", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="assistant")
    p.add_argument("--text", default=str(DEFAULT_TEXT))
    p.add_argument("--out")
    args = p.parse_args(argv)
    plan = QualityPlan()
    torch.set_num_threads(plan.threads)
    windows = text_windows(args.model, args.text, plan.ctx, plan.chunks)
    report = {"model": args.model, "text": args.text, "windows": len(windows), "ctx": plan.ctx,
              "rules": causes(args.model, windows, lambda m: print(m, file=sys.stderr, flush=True))}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
