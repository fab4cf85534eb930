"""Fewer ops per decode step, measured: `compile=True` (engine/compiled.py) against eager.

`python -m engine bench --compile [--model M ...] [--out report.json]` runs this instead of the HF
comparison. For each model (default: the SmolLM2-135M preset shape, then the chef) and each batch of
the plan (1, 2, 4, 8, 16, 32: where the compiled step stops paying sets EngineSettings.compile_max_batch):

  1. one HF folder (a preset is built with random weights and saved, as engine/bench/contestants.py `reference_folder` does);
     our engine loads it twice, eager and `compile=True`, so both run the same tensors;
  2. the first run of every shape on each engine is timed on its own: on the compiled engine it
     includes compiling (batch 1 and batch > 1 are one graph each), reported as `first_run_s`;
  3. every repeat times both engines at every batch, in an order swapped each repeat, so a noisy
     moment on shared cores hits both alike: TPOT of `generate()` (an order cooked on seats, whose
     pure-decode steps are what compile=True compiles; the compiled engine's compile_max_batch is
     the largest batch measured, so every batch runs compiled) and its TTFT (prefill, eager on both:
     a slower one would mean compiling slowed the process);
  4. every timed run's greedy tokens are compared: compiled must equal eager.

Record the OpenMP wait policy with it (the report's machine.omp_wait_policy_in_effect): PASSIVE
wakes a sleeping thread at every parallel region and doubled the 135M shape's step here.

Medians and minima of TPOT; ratios are compiled / eager medians (below 1.0: compile pays).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

from engine import Engine
from engine.bench.contestants import Samples, machine_facts, random_prompts, reference_folder
from engine.bench.report import emit

DEFAULT_MODELS = ("preset:smollm2-135m", "chef")
VARIANTS = ("eager", "compiled")


@dataclass(frozen=True)
class CompilePlan:
    decode_prompt_tokens: int = 64
    decode_tokens: int = 32
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    batch_prompt_tokens: int = 16  # batches above 1 (decode_prompt_tokens at batch 1)
    repeats: int = 5


@dataclass(frozen=True)
class CompiledModelResult:
    """One model's measurements; seconds."""

    model: str
    tpot_s: dict  # "b1" / "b2" / ... -> variant -> Samples.to_dict()
    ttft_s: dict  # same keys: TTFT (prefill runs eagerly on both engines)
    first_run_s: dict  # same keys -> variant -> seconds of the first generate (compiled: compiling, if any)
    compiled_steps: int  # decode steps the compiled engine ran compiled
    failure: str | None  # why the compiled engine decoded eagerly, if it did
    same_tokens: bool  # every timed compiled run gave eager's greedy tokens
    ratios: dict  # compiled / eager TPOT medians per shape


def _run(eng, prompts: list[list[int]], n: int) -> tuple[float, float, list[list[int]]]:
    """TPOT, TTFT and the greedy tokens of one generate() of n new tokens per prompt."""
    res = eng.generate(prompts, max_new_tokens=n, temperature=0.0, stop_at_eos=False)
    return res.metrics.tpot_s, res.metrics.ttft_s, res.tokens


def measure_model(model: str, plan: CompilePlan, progress) -> CompiledModelResult:

    with tempfile.TemporaryDirectory(prefix="bench-compile-") as workdir:
        folder = reference_folder(model, workdir)
        engines = {"eager": Engine.load(folder),
                   "compiled": Engine.load(folder, compile=True, compile_max_batch=max(plan.batches))}  # fmt: skip
    cfg = engines["eager"].cfg
    shapes = {
        f"b{b}": random_prompts(cfg.vocab_size, b, plan.decode_prompt_tokens if b == 1 else plan.batch_prompt_tokens,
                                seed=2 if b == 1 else 3)  # fmt: skip
        for b in plan.batches
    }
    n = plan.decode_tokens
    tpot = {s: {v: Samples() for v in VARIANTS} for s in shapes}
    ttft = {s: {v: Samples() for v in VARIANTS} for s in shapes}
    first: dict = {s: {} for s in shapes}
    same = True
    with torch.inference_mode():
        for s, prompts in shapes.items():  # the first run of each shape: the compiled one compiles
            for v in VARIANTS:
                t0 = time.perf_counter()
                _run(engines[v], prompts, n)
                first[s][v] = time.perf_counter() - t0
                progress(f"{model} {s} {v}: first run {first[s][v]:.1f} s")
        for i in range(plan.repeats):
            progress(f"{model}: repeat {i + 1}/{plan.repeats}")
            for s, prompts in shapes.items():
                tokens = {}
                for v in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
                    t, t_first, tokens[v] = _run(engines[v], prompts, n)
                    tpot[s][v].values.append(t)
                    ttft[s][v].values.append(t_first)
                same = same and tokens["eager"] == tokens["compiled"]
    compiled = engines["compiled"].compiled
    ratios = {s: tpot[s]["compiled"].median / tpot[s]["eager"].median for s in shapes}
    return CompiledModelResult(
        model, _dicts(tpot), _dicts(ttft), first, compiled.steps, compiled.failure, same, ratios,
    )  # fmt: skip


def _dicts(samples: dict) -> dict:
    return {s: {v: x.to_dict() for v, x in d.items()} for s, d in samples.items()}


def run(models=DEFAULT_MODELS, plan: CompilePlan | None = None, progress=lambda msg: None) -> dict:
    plan = plan or CompilePlan()
    t0, load0 = time.perf_counter(), os.getloadavg()
    results = [asdict(measure_model(m, plan, progress)) for m in models]
    return {
        "what": "compile=True (engine/compiled.py) vs eager decode, TPOT of generate() on seats, alternating",
        "plan": asdict(plan),
        "machine": machine_facts(),
        "load_average": {"start": list(load0), "end": list(os.getloadavg())},
        "models": results,
        "elapsed_s": time.perf_counter() - t0,
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def format_report(r: dict) -> str:
    lines = [f"compile=True vs eager, {r['machine']['torch_threads']} threads, OpenMP wait policy "
             f"{r['machine']['omp_wait_policy_in_effect']}, load {r['load_average']}"]
    for m in r["models"]:
        for s, d in m["tpot_s"].items():
            e, c = d["eager"], d["compiled"]
            te, tc = m["ttft_s"][s]["eager"], m["ttft_s"][s]["compiled"]
            lines.append(
                f"{m['model']} {s}: TPOT eager {e['median'] * 1e3:.2f} ms (min {e['min'] * 1e3:.2f}), "
                f"compiled {c['median'] * 1e3:.2f} ms (min {c['min'] * 1e3:.2f}), ratio {m['ratios'][s]:.3f}; "
                f"TTFT eager {te['median'] * 1e3:.1f} ms, compiled {tc['median'] * 1e3:.1f} ms; "
                f"first run eager {m['first_run_s'][s]['eager']:.1f} s, compiled {m['first_run_s'][s]['compiled']:.1f} s"
            )
        lines.append(
            f"  same tokens: {m['same_tokens']}, compiled steps {m['compiled_steps']}, failure {m['failure']}"
        )
    return "\n".join(lines)


def main(models: list[str] | None, out: str | None, as_json: bool, plan: CompilePlan, progress) -> int:

    return emit(run(tuple(models) if models else DEFAULT_MODELS, plan, progress), out, as_json, format_report)


if __name__ == "__main__":
    raise SystemExit(main(None, None, False, CompilePlan(), print))
