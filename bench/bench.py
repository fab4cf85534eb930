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

How each side is timed (wall clock, synchronised on GPU):
  HF   TTFT = t(generate with 1 new token);   TPOT = (t(n) - t(1)) / (n - 1)
  ours TTFT, TPOT from `res.metrics`; the wall-clock versions (same formulas as HF) are reported
       beside them, so a flattering internal timer would show up as a gap.
Achieved decode bandwidth = (weight bytes read per step + KV bytes read per step) / TPOT.
Worked example: 538 MB of fp32 weights and 3 MB of KV at TPOT 25 ms -> 21.6 GB/s; with a measured
roof of 29 GB/s the fraction is 0.75.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import torch

from bench.ceilings import measure_ceilings
from bench.report import (
    check_targets,
    derive_ratios,
    emit,
    format_report,
    gpu_goal_ratios,
    kernel_bounds,
    roofline_bounds,
)
from bench.roofline import Roofline, best_roof, measure_roofline, synchronize
from engine.errors import EngineError
from engine.loader import parse_device, parse_dtype

DEFAULT_MODEL = "preset:smollm2-135m"


@dataclass(frozen=True)
class Plan:
    """What to run. Token counts are per sequence; `repeats` timed runs follow `warmup` untimed ones."""

    prefill_tokens: int = 512
    prefill_batch: int = 1  # prompts of prefill_tokens in the prefill pass (8 x 1024 makes a GPU compute-bound)
    decode_prompt_tokens: int = 64
    decode_tokens: int = 32
    big_batch: int = 32
    big_batch_prompt_tokens: int = 16
    repeats: int = 5
    warmup: int = 1
    compile: bool = False  # ours with compile=True (engine/compiled.py): the targets then judge the compiled step


FULL = Plan(decode_prompt_tokens=128, decode_tokens=64, big_batch_prompt_tokens=32, repeats=5)
QUICK = Plan(decode_prompt_tokens=32, decode_tokens=8, big_batch_prompt_tokens=8, repeats=3)


@dataclass
class Samples:
    """Every timed value kept, so the JSON shows the spread and not just the median."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    def to_dict(self) -> dict:
        return {"median": self.median, "min": min(self.values, default=0.0), "samples": self.values}


# ---------------------------------------------------------------- shared weights


@dataclass
class Contestants:
    engine: object  # engine.Engine, loaded from `folder`
    hf: torch.nn.Module  # transformers model holding the same tensors
    folder: str
    weight_read_bytes: int  # bytes one decode step must read: every weight, LM head once
    vocab_size: int


def reference_folder(model: str, workdir: str) -> str:
    """The HF folder both sides load. A `preset:NAME` is built here with random weights and saved.

    The preset's config.json (engine.presets) becomes a transformers model, randomly initialised
    (seed 0), saved to `workdir`: the same loading path as any checkpoint. Any other model is
    already a folder (or a catalog name / hub id that resolves to one) and is used as it is.
    """
    from engine.loader import resolve_source

    source = resolve_source(model)
    if not source.startswith("preset:"):
        return source
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.presets import PRESETS, preset_config

    name = source.removeprefix("preset:")
    preset_config(name)  # unknown names are refused here, in one line
    raw = dict(PRESETS[name])
    config = AutoConfig.for_model(
        raw.pop("model_type"), **{k: v for k, v in raw.items() if k != "architectures"}
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(workdir)
    return workdir


def weight_read_bytes(hf: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: all parameters, a tied matrix once.

    An untied input embedding is only gathered (a few rows per step), so it is left out.
    """
    params = {p.data_ptr(): p for p in hf.parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    embed = hf.get_input_embeddings().weight
    head = hf.get_output_embeddings()
    if head is None or head.weight.data_ptr() != embed.data_ptr():
        total -= embed.numel() * embed.element_size()
    return total


def load_contestants(model: str, device: str, dtype: str, workdir: str, compile: bool = False) -> Contestants:
    """Both sides from one folder: HF via `from_pretrained`, ours via `Engine.load` (`compile`: its
    decode steps compiled, engine/compiled.py; the warm-up run pays the compile)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from engine import Engine

    hf_logging.disable_progress_bar()

    dev, tdtype = parse_device(device), parse_dtype(dtype)
    folder = reference_folder(model, workdir)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=tdtype).to(dev).eval()
    eng = Engine.load(folder, device=device, dtype=dtype, compile=compile)
    return Contestants(eng, hf, folder, weight_read_bytes(hf), hf.config.vocab_size)


# ---------------------------------------------------------------- timing one run of each side


def random_prompts(vocab_size: int, batch: int, length: int, seed: int) -> list[list[int]]:
    """Token ids, not text: both sides see identical inputs with no tokenizer in the timing."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (batch, length), generator=gen)  # (B, T); skip special ids
    return ids.tolist()


def run_hf(hf: torch.nn.Module, prompts: list[list[int]], n: int, device: torch.device) -> tuple[float, list]:
    """Wall seconds of one greedy HF `generate` making exactly n tokens per sequence."""
    ids = torch.tensor(prompts, device=device)  # (B, T), equal lengths: no padding
    mask = torch.ones_like(ids)
    synchronize(device)
    t0 = time.perf_counter()
    out = hf.generate(
        ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
    )
    synchronize(device)
    return time.perf_counter() - t0, out[:, ids.shape[1] :].tolist()


def run_ours(eng, prompts: list[list[int]], n: int, device: torch.device, cuda_graph: bool = False):
    """Wall seconds and the GenerationResult of one greedy engine request of n tokens."""
    synchronize(device)
    t0 = time.perf_counter()
    res = eng.generate(prompts, max_new_tokens=n, temperature=0.0, stop_at_eos=False, cuda_graph=cuda_graph)
    synchronize(device)
    return time.perf_counter() - t0, res


# ---------------------------------------------------------------- the three scenarios


def alternate(i: int, first, second) -> tuple:
    """Both results, (first(), second()), but run in swapped order on odd repeats so neither side
    always gets the warmer caches or the quieter moment."""
    if i % 2 == 0:
        a = first()
        return a, second()
    b = second()
    return first(), b


def measure_prefill(c: Contestants, plan: Plan, dev: torch.device, progress) -> dict:
    """TTFT of B prompts of P tokens (B = plan.prefill_batch): the wok's one parallel pass, then one token each."""
    prompt = random_prompts(c.vocab_size, plan.prefill_batch, plan.prefill_tokens, seed=1)  # (B, P) ids
    hf_ttft, ours_ttft, ours_wall, ours_prefill = Samples(), Samples(), Samples(), Samples()
    flops = 0.0
    for i in range(plan.warmup + plan.repeats):
        progress(f"prefill {plan.prefill_batch} x {plan.prefill_tokens} tokens: run {i + 1}/{plan.warmup + plan.repeats}")
        timed = i >= plan.warmup
        (hf_s, _), (wall, res) = alternate(
            i, lambda: run_hf(c.hf, prompt, 1, dev), lambda: run_ours(c.engine, prompt, 1, dev)
        )
        if timed:
            hf_ttft.values.append(hf_s)
            ours_wall.values.append(wall)
            ours_ttft.values.append(res.metrics.ttft_s)
            ours_prefill.values.append(res.metrics.prefill_s)
            flops = res.trace.prefill.flops
    return {
        "prompt_tokens": plan.prefill_tokens,
        "prompt_batch": plan.prefill_batch,
        "hf": {"ttft_s": hf_ttft.to_dict()},
        "ours": {
            "ttft_s": ours_ttft.to_dict(),
            "prefill_s": ours_prefill.to_dict(),
            "wall_s": ours_wall.to_dict(),
            "prefill_flops": flops,
            "prefill_flops_per_s": flops / ours_prefill.median if ours_prefill.median else 0.0,
        },
    }


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def time_hf_pair(c: Contestants, prompts: list[list[int]], n: int, dev: torch.device) -> dict:
    t1, _ = run_hf(c.hf, prompts, 1, dev)
    tn, tokens = run_hf(c.hf, prompts, n, dev)
    return {"t1": t1, "tn": tn, "tokens": tokens}


def time_ours_runs(c: Contestants, prompts: list[list[int]], n: int, dev: torch.device) -> dict:
    """t(1) and t(n) like HF's, plus (on CUDA) the same request replayed through CUDA graphs."""
    t1, _ = run_ours(c.engine, prompts, 1, dev)
    tn, res = run_ours(c.engine, prompts, n, dev)
    out = {"t1": t1, "tn": tn, "res": res}
    if dev.type == "cuda":
        out["graph"] = run_ours(c.engine, prompts, n, dev, cuda_graph=True)[1]
    return out


def measure_decode(
    c: Contestants, plan: Plan, dev: torch.device, batch: int, prompt_len: int, progress
) -> dict:
    """TPOT at one batch size: n tokens per sequence, the soup pot's one-token-per-step loop.

    Each repeat times t(1) and t(n) for both sides back to back, so (t(n) - t(1)) / (n - 1)
    subtracts a prefill measured moments earlier under the same noise.
    """
    n = plan.decode_tokens
    prompts = random_prompts(c.vocab_size, batch, prompt_len, seed=2)
    hf_tpot, ours_tpot, ours_wall_tpot, ours_tps = Samples(), Samples(), Samples(), Samples()
    graph_tpot, graph_tpot_all = Samples(), Samples()
    kv_read, match = 0.0, 0
    for i in range(plan.warmup + plan.repeats):
        progress(f"decode batch {batch}, {n} tokens: run {i + 1}/{plan.warmup + plan.repeats}")
        hf, ours = alternate(
            i, lambda: time_hf_pair(c, prompts, n, dev), lambda: time_ours_runs(c, prompts, n, dev)
        )
        if i < plan.warmup:
            continue
        hf_tpot.values.append((hf["tn"] - hf["t1"]) / (n - 1))
        res = ours["res"]
        ours_tpot.values.append(res.metrics.tpot_s)
        ours_tps.values.append(res.metrics.decode_tps)
        ours_wall_tpot.values.append((ours["tn"] - ours["t1"]) / (n - 1))
        if "graph" in ours:  # step 1 of a graphed request also records the graph: keep it apart
            graph_tpot_all.values.append(ours["graph"].metrics.tpot_s)
            graph_tpot.values.append(statistics.fmean(ours["graph"].metrics.itl_s[1:] or [0.0]))
        steps = res.trace.decode_steps
        kv_read = statistics.fmean(s.kv_tokens for s in steps) * c.engine.info.kv_bytes_per_token
        match = min(common_prefix(a, b) for a, b in zip(res.tokens, hf["tokens"], strict=True))
    out = {
        "batch": batch,
        "prompt_tokens": prompt_len,
        "new_tokens": n,
        "hf": {"tpot_s": hf_tpot.to_dict(), "decode_tps": batch / hf_tpot.median if hf_tpot.median else 0.0},
        "ours": {
            "tpot_s": ours_tpot.to_dict(),
            "wall_tpot_s": ours_wall_tpot.to_dict(),
            "decode_tps": ours_tps.to_dict(),
            "weight_bytes_per_step": c.weight_read_bytes,
            "kv_bytes_read_per_step": kv_read,
            "achieved_read_bytes_per_s": (c.weight_read_bytes + kv_read) / ours_tpot.median,
        },
        "greedy_tokens_matching_hf": match,
    }
    if graph_tpot.values:
        out["ours_cuda_graph"] = {
            "tpot_s": graph_tpot.to_dict(),  # steps 2..n: replaying the recorded graph
            "tpot_with_capture_s": graph_tpot_all.to_dict(),  # all steps, recording included
        }
    return out


def profile_decode(eng, batch: int, prompt_len: int, steps: int, dev: torch.device, top: int = 15) -> dict:
    """Where one decode step of `batch` sequences spends its time, per op (torch.profiler self time).

    Runs `decode_one_token` directly, `steps` times after a real prefill, so prefill's big GEMMs do
    not mix into the table. `aten::mm` is the weight GEMVs: the memory-bound part; everything else
    (norms, RoPE, attention, Python between ops) is per-step overhead the roofline does not model.
    """
    from torch.profiler import ProfilerActivity, profile

    from engine import decode_one_token, prefill
    from engine.batching import build_batch
    from engine.cache import StaticKVCache

    cfg = eng.cfg
    prompts = random_prompts(cfg.vocab_size, batch, prompt_len, seed=3)
    slots = prompt_len + steps + 1
    pre = build_batch(prompts, "padded", dev, slots)
    cache = StaticKVCache(cfg.n_layers, batch, cfg.n_kv_heads, cfg.head_dim, slots, eng.model.dtype, dev)
    tok = prefill(eng.model, pre, cache).argmax(-1)[:, None]  # (B, 1)
    valid = pre.valid.clone()  # (B, slots): which cache slots hold real tokens

    def one_step(i: int) -> None:
        slot = pre.slots_used + i
        valid[:, slot] = True
        mask = valid[:, None, None, : slot + 1]  # (B, 1, 1, S)
        positions = torch.full((batch, 1), prompt_len + i, device=dev)  # (B, 1)
        decode_one_token(eng.model, tok, positions, torch.tensor([slot], device=dev), mask, cache)

    one_step(0)  # warm-up
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for i in range(1, steps + 1):
            one_step(i)
        synchronize(dev)
    attr = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, attr), reverse=True)
    total_us = sum(getattr(e, attr) for e in events)
    rows = [
        {
            "op": e.key,
            "calls_per_step": e.count / steps,
            "ms_per_step": getattr(e, attr) / steps / 1e3,
            "share": getattr(e, attr) / total_us if total_us else 0.0,
        }
        for e in events[:top]
    ]
    return {
        "batch": batch,
        "steps": steps,
        "timer": attr,
        "ms_per_step_total": total_us / steps / 1e3,
        "top_ops": rows,
    }


def machine_facts() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import transformers

    from engine import OMP_WAIT_POLICY_IN_EFFECT

    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        # Threading knobs change decode speed a lot on shared cores (engine/__init__.py explains).
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        # The variable above is only what it says once torch is loaded: this is what OpenMP does.
        "omp_wait_policy_in_effect": OMP_WAIT_POLICY_IN_EFFECT,
    }


def run_bench(
    model: str = DEFAULT_MODEL,
    device: str = "cpu",
    dtype: str = "float32",
    quick: bool = False,
    plan: Plan | None = None,
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
    model: str, device: str, dtype: str, quick: bool, plan: Plan, progress, roofline, profile_steps: int
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


def validate(plan: Plan) -> None:
    for name in ("prefill_tokens", "prefill_batch", "decode_prompt_tokens", "big_batch", "big_batch_prompt_tokens",
                 "repeats"):  # fmt: skip
        if getattr(plan, name) < 1:
            raise EngineError(f"{name.replace('_', ' ')} must be at least 1, got {getattr(plan, name)}")
    if plan.decode_tokens < 2:
        raise EngineError(f"decode tokens must be at least 2 to time a decode step, got {plan.decode_tokens}")
    if plan.warmup < 0:
        raise EngineError(f"warm-up runs cannot be negative, got {plan.warmup}")


# ---------------------------------------------------------------- command line


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr (exit 2), like every other refusal."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see python -m bench --help)\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model to time (default {DEFAULT_MODEL})")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument(
        "--quick", action="store_true", help="fewer tokens and repeats (under a minute on 2 cores)"
    )
    p.add_argument("--json", action="store_true", help="print the full report as JSON on stdout")
    p.add_argument("--out", help="also write the JSON report to this file")
    p.add_argument("--repeats", type=int, help="timed runs per measurement (after one warm-up)")
    p.add_argument("--prefill-tokens", type=int, help="prompt length of the prefill measurement")
    p.add_argument("--prefill-batch", type=int, help="prompts in the prefill measurement (default 1)")
    p.add_argument("--decode-tokens", type=int, help="new tokens per sequence in the decode measurements")
    p.add_argument("--batch", type=int, help="the large decode batch (default 32)")
    p.add_argument("--threads", type=int, help="torch threads for every measurement (default: torch's)")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS", help="also profile STEPS decode steps")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--quant", help="int8: time int8 weights against float32/bfloat16 and HF instead (bench/int8.py)")
    p.add_argument("--compile", action="store_true",
                   help="time compile=True against eager decode instead (bench/compiled.py); "
                        "with --quant int8: also our float32 and int8 compiled")  # fmt: skip
    p.add_argument("--engine-compile", action="store_true",
                   help="the whole bench with our engine loaded compile=True: the targets judge the compiled step")  # fmt: skip
    return p.parse_args(argv)


def plan_from(args: argparse.Namespace) -> Plan:
    base = asdict(QUICK if args.quick else FULL)
    overrides = {
        "repeats": args.repeats,
        "prefill_tokens": args.prefill_tokens,
        "prefill_batch": args.prefill_batch,
        "decode_tokens": args.decode_tokens,
        "big_batch": args.batch,
        "compile": args.engine_compile or None,
    }
    return Plan(**(base | {k: v for k, v in overrides.items() if v is not None}))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        argv = argv[1:]
    args = parse_args(argv)
    if args.out and not os.access(os.path.dirname(os.path.abspath(args.out)), os.W_OK):
        print(
            f"error: cannot write the report to {args.out}: its folder is missing or read-only",
            file=sys.stderr,
        )
        return 2

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[bench] {msg}", file=sys.stderr, flush=True)

    if args.quant is not None:
        return run_quant(args, argv, progress)
    if args.compile:
        return run_compile(args, argv, progress)
    try:
        report = run_bench(
            args.model, args.device, args.dtype, args.quick, plan_from(args), progress,
            threads=args.threads, profile_steps=args.profile,
        )  # fmt: skip
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return emit(report, args.out, args.json, format_report)


def run_quant(args: argparse.Namespace, argv: list[str], progress) -> int:
    """`--quant int8`: the smaller-portions comparison (bench/int8.py), on --model or its two defaults;
    with `--compile`, our float32 and int8 also run compile=True in the same rotation."""
    from bench.int8 import QuantPlan
    from bench.int8 import main as quant_main
    from engine.quant import parse_quant

    try:
        parse_quant(args.quant)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plan = QuantPlan(**{k: v for k, v in (("repeats", args.repeats), ("decode_tokens", args.decode_tokens),
                                          ("prefill_tokens", args.prefill_tokens),
                                          ("compile", args.compile or None)) if v is not None})  # fmt: skip
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    models = [args.model] if any(a.startswith("--model") for a in argv) else None  # default: 135M and chef
    return quant_main(models, args.out, args.json, plan, progress)


def run_compile(args: argparse.Namespace, argv: list[str], progress) -> int:
    """`--compile`: the compiled decode step against eager (bench/compiled.py), on --model or its two defaults."""
    from bench.compiled import CompilePlan
    from bench.compiled import main as compile_main

    batches = (1, args.batch) if args.batch is not None else None  # --batch B: batch 1 and B only
    plan = CompilePlan(**{k: v for k, v in (("repeats", args.repeats), ("decode_tokens", args.decode_tokens),
                                            ("batches", batches)) if v is not None})  # fmt: skip
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    models = [args.model] if any(a.startswith("--model") for a in argv) else None  # default: 135M and chef
    return compile_main(models, args.out, args.json, plan, progress)


if __name__ == "__main__":
    raise SystemExit(main())
