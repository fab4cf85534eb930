"""`python -m engine bench peers`: our engine beside llama.cpp, the engine a CPU user would pick instead.

One run, same weights, same threads:
  1. find llama.cpp's build (scripts/build_llama_cpp.sh; --llama-cpp PREFIX) and convert each
     model's HF folder to GGUF f32 and q8_0 with its converter (reused when already there). The
     assistant (fetched once into the model cache, engine/model_store.py) is timed on the same
     files on both sides: ours loads the f32 GGUF for float32 and the q8_0 GGUF for int8, whose
     blocks are our int8 weights as they are (`our_source`);
  2. check greedy agreement: 32 tokens from one token-id prompt, llama.cpp (both GGUFs) and each of
     our configurations against HF transformers;
  3. time, in alternating rounds (the order reverses every round, so neither side always runs in
     the quieter moment): llama.cpp with `llama-bench` (batch-1 decode after a cached prompt,
     prefill) and `llama-batched-bench` (32 sequences), and our engine in each configuration
     (engine/bench/peer_ours.py, one process per round, its OpenMP settings in its environment);
  4. report medians and ranges, the load average, ratios ours / llama.cpp and the targets, as JSON
     and as a page (docs/benchmarks/peers-cpu.md); where a target is missed the kernel ceiling
     (our GEMMs alone on the same weights, engine/bench/ceilings.py) stands beside it.

Worked example of a ratio: llama.cpp f32 decodes the chef at 700 tokens/s and ours at 350, so
`decode fp32 default vs f32` is 0.50; the kernel-only chain at 1,400 tokens/s would say the kernels
leave room for 2.0x, so the gap is overhead, not arithmetic.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from engine.bench.contestants import machine_facts, random_prompts, reference_folder
from engine.bench.peer_llama import (
    DEFAULT_PREFIX,
    OUTTYPES,
    LlamaBuild,
    batched_bench,
    convert,
    find_build,
    gguf_path,
    greedy_tokens,
    llama_bench,
)
from engine.bench.peer_ours import TimingSpec, spec_json
from engine.bench.peers_page import page, write_page
from engine.bench.report import save_json
from engine.errors import EngineError, OneLineParser
from engine.loader import resolve_source
from engine.presets import CHEF_DIR

WORK = Path("/work/peers")  # GGUF files and the random-weight HF folders live outside the repository
# None: the embedded chef folder; "preset:": random weights of that shape; a name: a model the engine fetches
MODELS = {"chef": None, "smollm2-135m": "preset:smollm2-135m", "assistant": "assistant"}
SAME_FILES = {"assistant"}  # models ours loads from the very GGUF files llama.cpp runs (`our_source`)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass(frozen=True)
class Ours:
    """One configuration of our engine: `env` None = the app's default (nothing exported)."""

    name: str
    quant: str | None = None
    compile: bool = False
    native: bool = True  # the native step (engine/native.py); False: the model's forward, op by op
    env: tuple[tuple[str, str], ...] | None = None
    threads: int | None = None  # None: the run's --threads


OURS = (
    Ours("ours fp32 default"),  # what the app, the class kitchen and the bench run: the native step
    Ours("ours fp32 op-by-op", native=False),  # the model's forward, one torch op at a time
    Ours("ours fp32 compiled", compile=True),
    Ours("ours int8 default", quant="int8"),
    Ours("ours int8 op-by-op", quant="int8", native=False),
    Ours("ours int8 compiled", quant="int8", compile=True),
)
BATCHED = ("ours fp32 default", "ours int8 default")  # configurations also timed at batch 32
TARGETS = {  # ratio name -> the least it should be
    "decode_fp32_default_vs_f32": 1.0, "decode_int8_default_vs_q8_0": 1.0,
    "decode_fp32_best_vs_f32": 1.2, "decode_int8_best_vs_q8_0": 1.2,
    "prefill_fp32_best_vs_f32": 1.2, "prefill_int8_best_vs_q8_0": 1.2,
    "batch_decode_fp32_vs_f32": 2.0,
}  # fmt: skip


@dataclass(frozen=True)
class PeerPlan:
    rounds: int = 5
    threads: int = 1  # the app's engine on a 2-core machine (serving/cores.py); the native step runs one
    decode_prompt: int = 128  # batch-1 decode: new tokens after a prompt of this many
    decode_new: int = 128
    prefill: int = 512
    batch: int = 32  # sequences of the batched decode
    batch_prompt: int = 32
    batch_new: int = 32
    greedy_new: int = 32
    ours: tuple[str, ...] = tuple(c.name for c in OURS)  # our configurations to time


QUICK = PeerPlan(rounds=1, decode_prompt=16, decode_new=16, prefill=64, batch=4, batch_prompt=8, batch_new=8, greedy_new=8)


# ---------------------------------------------------------------- the report's arithmetic


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "samples": values}


def matching_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def ratios(medians: dict[str, dict[str, float]]) -> dict[str, float]:
    """Ours / llama.cpp from per-contestant medians ({name: {"decode_tps": ..., ...}})."""

    def best(prefix: str, key: str) -> float:
        return max((m.get(key, 0.0) for n, m in medians.items() if n.startswith(prefix)), default=0.0)

    f32, q8 = medians.get("llama.cpp f32", {}), medians.get("llama.cpp q8_0", {})
    pairs = {
        "decode_fp32_default_vs_f32": (medians.get("ours fp32 default", {}).get("decode_tps", 0.0), f32, "decode_tps"),
        "decode_fp32_best_vs_f32": (best("ours fp32", "decode_tps"), f32, "decode_tps"),
        "decode_int8_default_vs_q8_0": (medians.get("ours int8 default", {}).get("decode_tps", 0.0), q8, "decode_tps"),
        "decode_int8_best_vs_q8_0": (best("ours int8", "decode_tps"), q8, "decode_tps"),
        "prefill_fp32_best_vs_f32": (best("ours fp32", "prefill_tps"), f32, "prefill_tps"),
        "prefill_int8_best_vs_q8_0": (best("ours int8", "prefill_tps"), q8, "prefill_tps"),
        "batch_decode_fp32_vs_f32": (best("ours fp32", "batch_decode_tps"), f32, "batch_decode_tps"),
        "batch_decode_int8_vs_q8_0": (best("ours int8", "batch_decode_tps"), q8, "batch_decode_tps"),
    }  # fmt: skip
    return {k: ours / peer[key] for k, (ours, peer, key) in pairs.items() if ours and peer.get(key)}


def check_targets(r: dict[str, float]) -> dict[str, dict]:
    return {k: {"ratio": r[k], "target": t, "met": r[k] >= t} for k, t in TARGETS.items() if k in r}


# ---------------------------------------------------------------- preparing the weights


def hf_folder(model: str, work: Path) -> str:
    """The HF folder of `model`: the chef as it ships; the 135M shape built once with seeded random
    weights (engine/bench/contestants.py) and the chef's tokenizer beside them (GGUF needs a vocabulary);
    the assistant as the model cache holds it (fetched and converted on first use)."""
    source = MODELS[model]
    if source is None:
        return str(CHEF_DIR)
    if not source.startswith("preset:"):
        return resolve_source(source)
    folder = work / "hf" / model
    if not (folder / "model.safetensors").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        reference_folder(source, str(folder))
    for name in TOKENIZER_FILES:
        shutil.copyfile(CHEF_DIR / name, folder / name)
    return str(folder)


def prepare(build: LlamaBuild, models: list[str], work: Path, progress) -> dict[str, dict]:
    """Each model's HF folder and its GGUF files (converted once, then reused); writes work/READY."""
    out = {}
    for model in models:
        folder = hf_folder(model, work)
        ggufs = {}
        for t in OUTTYPES:
            progress(f"GGUF {t} of {model}")
            ggufs[t] = str(convert(build, folder, gguf_path(work / "gguf", model, t), t))
        out[model] = {"folder": folder, "gguf": ggufs}
    (work / "READY").write_text("\n".join(p for m in out.values() for p in m["gguf"].values()) + "\n")
    return out


def our_source(model: str, prep: dict, quant: str | None) -> str:
    """What our engine loads for one configuration: the same GGUF file as llama.cpp's counterpart
    (f32 for float32, q8_0 for int8) for SAME_FILES models, else the HF folder."""
    if model not in SAME_FILES:
        return prep["folder"]
    return prep["gguf"]["q8_0" if quant == "int8" else "f32"]


# ---------------------------------------------------------------- one contestant, one round


def run_ours(cfg: Ours, spec: TimingSpec, timeout: float = 900) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS} | dict(cfg.env or ())
    spec = replace(spec, quant=cfg.quant, compile=cfg.compile, native=cfg.native, threads=cfg.threads or spec.threads)
    cmd = [sys.executable, "-m", "engine.bench.peer_ours", spec_json(spec)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"{cfg.name} failed: {tail[0][:300]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_llama(build: LlamaBuild, gguf: str, plan: PeerPlan) -> dict:
    """One round of llama.cpp; a batched run that fails leaves that round's batched sample out, in one line."""
    out = llama_bench(build, Path(gguf), plan.threads, plan.prefill, plan.decode_new, plan.decode_prompt)
    try:
        out["batch_decode_tps"] = batched_bench(build, Path(gguf), plan.threads, plan.batch, plan.batch_prompt,
                                                plan.batch_new)  # fmt: skip
    except EngineError as err:
        print(f"[peers] {Path(gguf).name}: {err}", file=sys.stderr, flush=True)
    return out


def hf_greedy(folder: str, prompt: list[int], n: int) -> list[int]:
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])  # (1, T)
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def bench_model(build: LlamaBuild, model: str, prep: dict, plan: PeerPlan, progress) -> dict:
    folder, ggufs = prep["folder"], prep["gguf"]
    config = json.loads((Path(folder) / "config.json").read_text())
    vocab = config["vocab_size"]
    # a prompt that leaves room for its one new token (the chef's context is 512)
    plan = replace(plan, prefill=min(plan.prefill, config.get("max_position_embeddings", plan.prefill + 1) - 1))
    greedy_prompt = random_prompts(vocab, 1, 16, seed=3)[0]
    base = TimingSpec(folder, threads=plan.threads, decode_prompt=random_prompts(vocab, 1, plan.decode_prompt, 2)[0],
               decode_new=plan.decode_new, prefill_prompt=random_prompts(vocab, 1, plan.prefill, 1)[0],
               batch_new=plan.batch_new)  # fmt: skip
    batch_prompts = random_prompts(vocab, plan.batch, plan.batch_prompt, seed=4)
    progress(f"{model}: greedy agreement, {plan.greedy_new} tokens")
    reference = hf_greedy(folder, greedy_prompt, plan.greedy_new)
    agreement = {f"llama.cpp {t}": matching_prefix(greedy_tokens(build, Path(ggufs[t]), greedy_prompt,
                                                                 plan.greedy_new, plan.threads), reference)
                 for t in OUTTYPES}  # fmt: skip
    names = [f"llama.cpp {t}" for t in OUTTYPES] + list(plan.ours)
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    ceilings, details = {}, {}
    for r in range(plan.rounds):
        order = names if r % 2 == 0 else names[::-1]
        load = os.getloadavg()[0]
        for name in order:
            progress(f"{model}: round {r + 1}/{plan.rounds}, {name} (load {load:.2f})")
            if name.startswith("llama.cpp"):
                got = run_llama(build, ggufs[name.split()[-1]], plan)
            else:
                cfg = next(c for c in OURS if c.name == name)
                spec = replace(base, folder=our_source(model, prep, cfg.quant),
                              batch_prompts=batch_prompts if name in BATCHED else None,
                              greedy_prompt=greedy_prompt if r == 0 else None, greedy_new=plan.greedy_new,
                              ceilings=r == 0 and name == OURS[0].name)  # fmt: skip
                got = run_ours(cfg, spec)
                if "greedy_tokens" in got:
                    agreement[name] = matching_prefix(got.pop("greedy_tokens"), reference)
                ceilings |= {k: got.pop(k) for k in list(got) if k.startswith("ceiling_")}
                details[name] = {k: got.pop(k) for k in list(got) if not k.endswith("_tps")}
            for k, v in got.items():
                samples[name].setdefault(k, []).append(v)
    results = {n: {k: summary(v) for k, v in s.items()} for n, s in samples.items()}
    medians = {n: {k: v["median"] for k, v in s.items()} for n, s in results.items()}
    r = ratios(medians)
    # what our fp32 GEMMs alone would reach against llama.cpp: the ceiling of any fp32 configuration
    peers = {n: m for n, m in medians.items() if n.startswith("llama.cpp")}
    # the default runs the native step's own products where they are built: their chain is its ceiling
    best = {k.removeprefix("ceiling_"): v for k, v in ceilings.items() if not k.startswith("ceiling_native_")}
    for key in ("decode_tps", "prefill_tps", "batch_decode_tps"):
        best[key] = ceilings.get(f"ceiling_native_{key}", best.get(key))
    ceiling = {"ours fp32 default": best}
    sources = {q or "fp32": our_source(model, prep, q) for q in (None, "int8")}
    return {"plan": plan.__dict__, "folder": folder, "gguf": ggufs, "ours_loads": sources, "greedy_tokens_matching_hf": agreement, "greedy_of": plan.greedy_new,
            "results": results, "ours_details": details, "kernel_ceilings_tps": ceilings, "ratios": r,
            "ceiling_ratios": ratios(peers | ceiling), "targets": check_targets(r)}  # fmt: skip


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m engine bench peers", description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", default=str(DEFAULT_PREFIX), help=f"llama.cpp's build prefix (default {DEFAULT_PREFIX})")
    p.add_argument("--work", default=str(WORK), help=f"where GGUF files and built HF folders go (default {WORK})")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--rounds", type=int, help="alternating rounds (default 5)")
    p.add_argument("--threads", type=int, help="threads for both sides (default 1, the app's engine on 2 cores)")
    p.add_argument("--ours", help="comma-separated names of our configurations to time (default: all; "
                   "spinning ones collapse on busy cores, see docs/benchmarks/wait-policy-cpu.md)")
    p.add_argument("--quick", action="store_true", help="one round of short runs (a smoke test)")
    p.add_argument("--convert-only", action="store_true", help="only build the GGUF files (and work/READY)")
    p.add_argument("--out", help="write the JSON report here (default: print it)")
    p.add_argument("--page", help="write the markdown page here")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
        models = [m for m in args.models.split(",") if m]
        bad = next((m for m in models if m not in MODELS), None)
        if bad is not None:
            raise EngineError(f"unknown model '{bad}' for the peer bench (known: {', '.join(MODELS)})")
        ours = tuple(n.strip() for n in args.ours.split(",")) if args.ours else None
        unknown = next((n for n in ours or () if n not in {c.name for c in OURS}), None)
        if unknown is not None:
            raise EngineError(f"unknown configuration '{unknown}' (known: {', '.join(c.name for c in OURS)})")
        plan = replace(QUICK if args.quick else PeerPlan(), **{k: v for k, v in (("rounds", args.rounds),
                                                                            ("threads", args.threads),
                                                                            ("ours", ours)) if v})  # fmt: skip
        if plan.rounds < 1 or not 1 <= plan.threads <= (os.cpu_count() or 1):
            raise EngineError(f"rounds must be >= 1 and threads 1..{os.cpu_count()} (got {plan.rounds}, {plan.threads})")
        build = find_build(args.llama_cpp)
        work = Path(args.work)

        def progress(msg: str) -> None:
            print(f"[peers] {msg}", file=sys.stderr, flush=True)

        prep = prepare(build, models, work, progress)
        if args.convert_only:
            print("\n".join(p for m in prep.values() for p in m["gguf"].values()))
            return 0
        report = run_all(build, prep, plan, progress)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = save_json(report, args.out, indent=1)
    if not args.out:
        print(text)
    if args.page:
        write_page(Path(args.page), page(report))
    return 0


def run_all(build: LlamaBuild, prep: dict, plan: PeerPlan, progress) -> dict:
    loads, t0 = [os.getloadavg()[0]], time.perf_counter()
    models = {}
    for model, p in prep.items():
        models[model] = bench_model(build, model, p, plan, progress)
        loads.append(os.getloadavg()[0])
    version = subprocess.run([build.tool("llama-bench"), "--version"], capture_output=True, text=True)
    return {
        "plan": plan.__dict__, "machine": machine_facts(), "llama_cpp": (version.stdout or version.stderr).strip()[:120],
        "load_average": {"min": min(loads), "max": max(loads), "samples": loads}, "models": models,
        "elapsed_s": time.perf_counter() - t0, "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
