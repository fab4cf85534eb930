"""Smaller portions measured: int8 weights against float32 (and bfloat16) in one interleaved run.

`python -m engine bench --quant int8 [--model M ...] [--out report.json]` runs this instead of the
HF comparison. For each model (default: the SmolLM2-135M preset shape, then the chef):

  1. one HF folder (a preset is built with random weights and saved, as engine/bench/contestants.py `reference_folder` does);
     our engine loads it three times -- float32, bfloat16, int8 -- and HF `generate` loads it in
     float32;
  2. every repeat times each variant once, in an order rotated by one each repeat, so a noisy
     moment on shared cores hits every variant alike: TPOT at batch 1 (n tokens after a short
     prompt; ours from the trace, HF from one run's token stamps, engine/bench/contestants.py `Run`) and the prefill pass of one long
     prompt. One untimed warm-up of every shape comes first;
  3. the kernel ceilings of the int8 and float32 weights (engine/bench/ceilings.py: the batch-1 matmul
     chain with nothing in between), so a missed target says whether the kernels allow it;
  4. greedy agreement of int8 with float32 over `agreement_tokens` tokens (the chef: 256).

With `--compile` (`QuantPlan.compile`) our float32 and int8 are also loaded with compile=True
(engine/compiled.py: the pure-decode step as one compiled function, int8 products as the opaque op
of engine/int8_op.py) and timed in the same rotation, as "float32_compiled" and "int8_compiled";
the report then counts the steps that really ran compiled and compares their greedy tokens with
the eager ones. Prefill runs eagerly on every engine either way.

Ratios are medians of per-repeat values. Targets: int8 TPOT <= 0.6 x our float32 and
<= 0.5 x HF float32 `generate`, on the 135M shape at batch 1; prefill not slower.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
from transformers import AutoModelForCausalLM

from engine import Engine
from engine.bench.ceilings import matmul_chain, time_chain
from engine.bench.contestants import (
    Samples,
    common_prefix,
    machine_facts,
    random_prompts,
    reference_folder,
    run_hf,
)
from engine.bench.report import emit
from engine.bench.roofline import synchronize

VARIANTS = ("float32", "bfloat16", "int8")  # ours; "hf" (float32 generate) is the fourth contestant
COMPILED = ("float32_compiled", "int8_compiled")  # ours with compile=True, when QuantPlan.compile
DEFAULT_MODELS = ("preset:smollm2-135m", "chef")


@dataclass(frozen=True)
class QuantPlan:
    decode_prompt_tokens: int = 64
    decode_tokens: int = 32
    prefill_tokens: int = 256
    repeats: int = 5
    agreement_tokens: int = 256  # capped by the model's context
    compile: bool = False  # also time our float32 and int8 with compile=True (COMPILED)

    @property
    def variants(self) -> tuple[str, ...]:
        return VARIANTS + (COMPILED if self.compile else ())


@dataclass(frozen=True)
class Int8ModelResult:
    """One model's measurements; times in seconds, medians over repeats."""

    model: str
    tpot_s: dict  # variant -> Samples.to_dict(), "hf" included
    prefill_s: dict  # variant -> Samples.to_dict(), "hf" = TTFT of a 1-token generate
    weight_bytes: dict  # variant -> bytes on the device (ModelInfo.weight_bytes)
    kernel_b1_s: dict  # "float32" / "int8" -> batch-1 matmul chain seconds (engine/bench/ceilings.py)
    greedy_agreement: dict  # int8 vs float32: tokens compared, common prefix, positions equal
    ratios: dict
    compiled: dict  # with plan.compile: variant -> steps run compiled / eagerly, failure; agreement with eager


def _load(folder: str, variant: str):
    """"int8", a dtype, or either with "_compiled" (compile=True; the first generate compiles)."""

    base = variant.removesuffix("_compiled")
    kind = {"quant": "int8"} if base == "int8" else {"dtype": base}
    return Engine.load(folder, compile=variant != base, **kind)


def _time_ours(eng, prompt: list[list[int]], n: int) -> float:
    res = eng.generate(prompt, max_new_tokens=n, temperature=0.0, stop_at_eos=False)
    return res.metrics.tpot_s


def _time_prefill(eng, prompt: list[list[int]]) -> float:
    return eng.generate(prompt, max_new_tokens=1, temperature=0.0, stop_at_eos=False).metrics.prefill_s


def _hf_tpot(hf, prompt: list[list[int]], n: int) -> float:
    return run_hf(hf, prompt, n, torch.device("cpu")).tpot_s


def agreement(a: list[int], b: list[int]) -> dict:
    """How far two greedy continuations agree: the common prefix, and positions equal overall."""
    return {"tokens": min(len(a), len(b)), "common_prefix": common_prefix(a, b),
            "positions_equal": sum(x == y for x, y in zip(a, b, strict=False))}  # fmt: skip


def measure_model(model: str, plan: QuantPlan, progress) -> Int8ModelResult:

    with tempfile.TemporaryDirectory(prefix="bench-int8-") as workdir:
        folder = reference_folder(model, workdir)
        engines = {v: _load(folder, v) for v in plan.variants}
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    cfg = engines["float32"].cfg
    n = plan.decode_tokens
    short = random_prompts(cfg.vocab_size, 1, plan.decode_prompt_tokens, seed=2)
    long = random_prompts(cfg.vocab_size, 1, min(plan.prefill_tokens, cfg.max_context - 1), seed=1)
    tpot = {v: Samples() for v in (*plan.variants, "hf")}
    pre = {v: Samples() for v in (*plan.variants, "hf")}

    def one(variant: str, timed: bool) -> None:
        if variant == "hf":
            t, p = _hf_tpot(hf, short, n), run_hf(hf, long, 1, torch.device("cpu")).ttft_s
        else:
            t, p = _time_ours(engines[variant], short, n), _time_prefill(engines[variant], long)
        if timed:
            tpot[variant].values.append(t)
            pre[variant].values.append(p)

    order = [*plan.variants, "hf"]
    with torch.inference_mode():
        for v in order:  # warm every shape of every contestant once, untimed
            one(v, timed=False)
        for i in range(plan.repeats):
            progress(f"{model}: repeat {i + 1}/{plan.repeats}")
            for v in order[i % len(order) :] + order[: i % len(order)]:  # rotated each repeat
                one(v, timed=True)
        progress(f"{model}: kernel ceilings and greedy agreement")
        kernels = {v: time_chain(matmul_chain(engines[v].model, 1, 1), torch.device("cpu"), plan.repeats)
                   for v in ("float32", "int8")}  # fmt: skip
        agree_n = min(plan.agreement_tokens, cfg.max_context - plan.decode_prompt_tokens)
        runs = {v: engines[v].generate(short, max_new_tokens=agree_n, stop_at_eos=False).tokens[0]
                for v in ("float32", "int8", *(COMPILED if plan.compile else ()))}  # fmt: skip
    med = {v: s.median for v, s in tpot.items()}
    pmed = {v: s.median for v, s in pre.items()}
    ratios = {
        "int8_tpot_vs_fp32": med["int8"] / med["float32"],
        "int8_tpot_vs_hf_fp32": med["int8"] / med["hf"],
        "int8_tpot_vs_bf16": med["int8"] / med["bfloat16"],
        "int8_prefill_vs_fp32": pmed["int8"] / pmed["float32"],
        "int8_prefill_vs_bf16": pmed["int8"] / pmed["bfloat16"],
        "int8_kernel_b1_vs_fp32_tpot": kernels["int8"] / med["float32"],  # the best int8 could do
        "int8_kernel_b1_vs_hf_tpot": kernels["int8"] / med["hf"],
    }
    compiled = {}
    if plan.compile:
        ratios |= {
            "int8_compiled_tpot_vs_fp32": med["int8_compiled"] / med["float32"],
            "int8_compiled_tpot_vs_fp32_compiled": med["int8_compiled"] / med["float32_compiled"],
            "int8_compiled_tpot_vs_hf_fp32": med["int8_compiled"] / med["hf"],
            "int8_compiled_tpot_vs_int8": med["int8_compiled"] / med["int8"],
            "fp32_compiled_tpot_vs_fp32": med["float32_compiled"] / med["float32"],
            "int8_kernel_b1_vs_fp32_compiled_tpot": kernels["int8"] / med["float32_compiled"],
        }
        for v in COMPILED:
            cd, eager = engines[v].compiled, v.removesuffix("_compiled")
            compiled[v] = {"steps": cd.steps, "eager_steps": cd.eager_steps, "failure": cd.failure,
                           "agreement_with_eager": agreement(runs[eager], runs[v])}  # fmt: skip
    return Int8ModelResult(
        model, {v: s.to_dict() for v, s in tpot.items()}, {v: s.to_dict() for v, s in pre.items()},
        {v: engines[v].info.weight_bytes for v in VARIANTS}, kernels,
        agreement(runs["float32"], runs["int8"]), ratios, compiled,
    )  # fmt: skip


def run(models=DEFAULT_MODELS, plan: QuantPlan | None = None, progress=lambda msg: None) -> dict:
    plan = plan or QuantPlan()
    t0, load0 = time.perf_counter(), os.getloadavg()
    results = [asdict(measure_model(m, plan, progress)) for m in models]
    synchronize(torch.device("cpu"))
    return {
        "what": "int8 weights vs float32 / bfloat16 (ours) and HF float32 generate, interleaved, batch 1",
        "plan": asdict(plan),
        "machine": machine_facts(),
        "load_average": {"start": list(load0), "end": list(os.getloadavg())},
        "models": results,
        "targets": {"int8_tpot_vs_fp32": 0.6, "int8_tpot_vs_hf_fp32": 0.5},
        "elapsed_s": time.perf_counter() - t0,
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def format_report(r: dict) -> str:
    lines = [f"int8 weights, batch 1, {r['machine']['torch_threads']} threads, load {r['load_average']}"]
    for m in r["models"]:
        t, p = m["tpot_s"], m["prefill_s"]
        lines.append(f"{m['model']}: TPOT ms " + ", ".join(f"{v} {t[v]['median'] * 1e3:.2f}" for v in t)
                     + " | prefill ms " + ", ".join(f"{v} {p[v]['median'] * 1e3:.1f}" for v in p))  # fmt: skip
        lines.append("  " + ", ".join(f"{k} {v:.3f}" for k, v in m["ratios"].items()))
        lines.append(f"  greedy int8 vs fp32: {m['greedy_agreement']}")
        for v, c in m["compiled"].items():
            lines.append(f"  {v}: {c}")
    return "\n".join(lines)


def main(models: list[str] | None, out: str | None, as_json: bool, plan: QuantPlan, progress) -> int:

    return emit(run(tuple(models) if models else DEFAULT_MODELS, plan, progress), out, as_json, format_report)


if __name__ == "__main__":
    raise SystemExit(main(None, None, False, QuantPlan(), print))
