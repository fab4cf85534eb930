"""The benchmark: our engine against HF `generate` on the same weights, and both against the roofs.

One run, one machine, one set of random weights, so every ratio compares like with like:

  1. measure the roofline (read bandwidth, GEMM FLOP/s) for this device, dtype and thread count,
     three times (start, between the scenarios, end) and keep the best of each roof, so a roof
     taken in a noisy moment cannot flatter the achieved fractions;
  2. build the reference HF model (random weights), save it, and `Engine.load` that folder, so our
     engine reads exactly the tensors HF runs;
  3. time, interleaving ours and HF's runs so noise from neighbours hits both alike:
       prefill: one prompt of P tokens, `max_new_tokens=1`                     -> TTFT
       decode at batch 1 and at batch B: n new tokens after a short prompt    -> TPOT, tokens/s
  4. derive the ratios (ours / HF, achieved / roof), all from medians over repeats after warm-up.

How each side is timed (the caller's clock, synchronised on GPU; engine/bench/contestants.py `Run`):
  both  each step's tokens are stamped as they reach the caller (HF through a `generate` streamer,
        ours through `Engine.stream`): TTFT = the first stamp, TPOT = (last - first) / (n - 1)
  ours  also TTFT and TPOT from `res.metrics`, the engine's own timer; the caller's-clock versions
        are reported beside them, so a flattering internal timer would show up as a gap.
Achieved decode bandwidth = (weight bytes read per step + KV bytes read per step) / TPOT.
Worked example: 538 MB of fp32 weights and 3 MB of KV at TPOT 25 ms -> 21.6 GB/s; with a measured
roof of 29 GB/s the fraction is 0.75.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict

import torch

from engine.bench.ceilings import measure_ceilings
from engine.bench.contestants import load_contestants, machine_facts
from engine.bench.plan import DEFAULT_MODEL, FULL, QUICK, BenchPlan, validate
from engine.bench.report import (
    check_targets,
    derive_ratios,
    gpu_goal_ratios,
    kernel_bounds,
    roofline_bounds,
)
from engine.bench.roofline import Roofline, best_roof, measure_roofline
from engine.bench.scenarios import measure_decode, measure_prefill, profile_decode
from engine.errors import EngineError
from engine.loader import parse_device, parse_dtype


def run_bench(
    model: str = DEFAULT_MODEL,
    device: str = "cpu",
    dtype: str = "float32",
    quick: bool = False,
    plan: BenchPlan | None = None,
    progress=lambda msg: None,
    roofline: Roofline | None = None,
    threads: int | None = None,
    profile_steps: int = 0,
) -> dict:
    """Measure everything in one run and return the JSON-ready report (see the module docstring).

    `roofline` skips the roof measurement (tests pass a small one); the CLI always measures.
    `threads` sets torch's intra-op threads for every measurement (both sides and the roofline);
    `profile_steps` > 0 adds a per-op profile of that many of our batch-1 decode steps.
    """
    plan = plan or (QUICK if quick else FULL)
    validate(plan)
    parse_device(device), parse_dtype(dtype)  # refuse bad names before any work
    if threads is not None and not 1 <= threads <= (os.cpu_count() or 1):
        raise EngineError(
            f"threads must be between 1 and {os.cpu_count()} (this machine's cores), got {threads}"
        )
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return measure_all(model, device, dtype, quick, plan, progress, roofline, profile_steps)
    finally:
        torch.set_num_threads(before)


def measure_all(
    model: str, device: str, dtype: str, quick: bool, plan: BenchPlan, progress, roofline, profile_steps: int
) -> dict:
    """The run itself, in order: roofs, weights, prefill, decode b1, decode bB, optional profile."""
    dev = parse_device(device)
    t_start, load_start = time.perf_counter(), os.getloadavg()
    roofs = [roofline] if roofline else []

    def measure_roof() -> None:
        if roofline is None:
            progress(f"roofline on {device} {dtype} ({len(roofs) + 1}/3)")
            roofs.append(measure_roofline(device, dtype, quick=quick))

    measure_roof()
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as workdir:
        progress(f"building {model} and loading the same weights into both sides")
        t0 = time.perf_counter()
        c = load_contestants(model, device, dtype, workdir, plan.compile)
        load_s = time.perf_counter() - t0
        with torch.inference_mode():
            prefill = measure_prefill(c, plan, dev, progress)
            measure_roof()
            b1 = measure_decode(c, plan, dev, 1, plan.decode_prompt_tokens, progress)
            bbig = measure_decode(c, plan, dev, plan.big_batch, plan.big_batch_prompt_tokens, progress)
            progress("kernel ceilings: the model's own GEMMs and attention with nothing in between")
            ceilings = measure_ceilings(
                c.engine.model, plan.prefill_tokens, (1, plan.big_batch), plan.repeats, plan.prefill_batch
            )
            if profile_steps:
                progress(f"profiling {profile_steps} decode steps at batch 1 and {plan.big_batch}")
                profile = {
                    f"b{b}": profile_decode(c.engine, b, p, profile_steps, dev)
                    for b, p in (
                        (1, plan.decode_prompt_tokens),
                        (plan.big_batch, plan.big_batch_prompt_tokens),
                    )
                }
        info = asdict(c.engine.info)
        cd = c.engine.compiled  # with plan.compile: how many of our decode steps really ran compiled
        compiled = None if cd is None else {"steps": cd.steps, "eager_steps": cd.eager_steps, "failure": cd.failure}
    measure_roof()
    roof = best_roof(roofs)
    ratios = derive_ratios(roof, prefill, b1, bbig)
    ratios |= gpu_goal_ratios(model, device, ratios, b1)
    bounds = roofline_bounds(roof, prefill, b1, bbig, torch.finfo(parse_dtype(dtype)).bits // 8)
    kernels = kernel_bounds(ceilings, roof, prefill, b1, bbig)
    return {
        "model": model,
        "device": device,
        "dtype": dtype,
        "quick": quick,
        "plan": asdict(plan),
        "model_info": {k: str(v) if not isinstance(v, (int, float, bool)) else v for k, v in info.items()},
        "machine": machine_facts(),
        **({"compiled_decode": compiled} if compiled is not None else {}),
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "roofline": roof.to_dict(),
        "prefill": prefill,
        "decode_b1": b1,
        f"decode_b{plan.big_batch}": bbig,
        **({"decode_profile": profile} if profile_steps else {}),
        "ratios": ratios,
        "ratio_bounds": bounds,
        "kernel_ceilings": ceilings,
        "ratio_kernel_bounds": kernels,
        "targets": check_targets(ratios, bounds, kernels),
        "load_s": load_s,
        "elapsed_s": time.perf_counter() - t_start,
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
