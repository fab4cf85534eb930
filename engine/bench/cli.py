"""`python -m engine bench [peers | serve-bench] ...`: the command line of every benchmark in engine/bench/.

  python -m engine bench ...              the main bench (engine/bench/bench.py); `--quant int8` (engine/bench/int8.py)
                                          and `--compile` (engine/bench/compiled.py) time those comparisons instead
  python -m engine bench peers ...        our engine beside llama.cpp (engine/bench/peers.py)
  python -m engine bench int8-quality ... int8's fidelity to float32, and llama.cpp Q8_0's to F32 (engine/bench/int8_quality.py)
  python -m engine bench wait-policy ...  OpenMP's wait policies: our decode and a neighbour's share (engine/bench/wait_policy.py)
  python -m engine bench step-profile ... one serving decode step's parts, in µs (engine/bench/step_profile.py)
  python -m engine bench native-sweep ... the native step against op by op, by batch (engine/bench/native_sweep.py)
  python -m engine bench serve-bench ...  the Poisson load over the scheduler (engine/bench/serve_bench.py)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import asdict

import torch

from engine.bench import compiled, int8, int8_quality, peers, serve_bench, wait_policy
from engine.bench.bench import run_bench
from engine.bench.plan import DEFAULT_MODEL, FULL, QUICK, BenchPlan
from engine.bench.report import emit, format_report
from engine.errors import EngineError, OneLineParser
from engine.quant import parse_quant


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m engine bench", description=__doc__.splitlines()[0])
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
    p.add_argument("--quant", help="int8: time int8 weights against float32/bfloat16 and HF instead (engine/bench/int8.py)")
    p.add_argument("--compile", action="store_true",
                   help="time compile=True against eager decode instead (engine/bench/compiled.py); "
                        "with --quant int8: also our float32 and int8 compiled")  # fmt: skip
    p.add_argument("--engine-compile", action="store_true",
                   help="the whole bench with our engine loaded compile=True: the targets judge the compiled step")  # fmt: skip
    return p.parse_args(argv)


def plan_from(args: argparse.Namespace) -> BenchPlan:
    base = asdict(QUICK if args.quick else FULL)
    overrides = {
        "repeats": args.repeats,
        "prefill_tokens": args.prefill_tokens,
        "prefill_batch": args.prefill_batch,
        "decode_tokens": args.decode_tokens,
        "big_batch": args.batch,
        "compile": args.engine_compile or None,
    }
    return BenchPlan(**(base | {k: v for k, v in overrides.items() if v is not None}))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        argv = argv[1:]
    if argv[:1] == ["peers"]:
        return peers.main(argv[1:])
    if argv[:1] == ["int8-quality"]:
        return int8_quality.main(argv[1:])
    if argv[:1] == ["native-sweep"]:  # its own process, like step-profile
        return subprocess.run([sys.executable, "-m", "engine.bench.native_sweep", *argv[1:]]).returncode
    if argv[:1] == ["step-profile"]:  # its own process: the engine's OpenMP defaults need engine before torch
        return subprocess.run([sys.executable, "-m", "engine.bench.step_profile", *argv[1:]]).returncode
    if argv[:1] == ["wait-policy"]:
        return wait_policy.main(argv[1:])
    if argv[:1] == ["serve-bench"]:
        try:
            return int(serve_bench.main(argv[1:]) or 0)
        except EngineError as err:  # a refused setting: one line, like every other bench's
            print(f"error: {err}", file=sys.stderr)
            return 2
    try:
        args = parse_args(argv)
    except EngineError as err:  # a malformed option
        print(f"error: {err}", file=sys.stderr)
        return 2
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
    """`--quant int8`: the smaller-portions comparison (engine/bench/int8.py), on --model or its two defaults;
    with `--compile`, our float32 and int8 also run compile=True in the same rotation."""
    try:
        parse_quant(args.quant)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plan = int8.QuantPlan(**{k: v for k, v in (("repeats", args.repeats), ("decode_tokens", args.decode_tokens),
                                          ("prefill_tokens", args.prefill_tokens),
                                          ("compile", args.compile or None)) if v is not None})  # fmt: skip
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    models = [args.model] if any(a.startswith("--model") for a in argv) else None  # default: 135M and chef
    return int8.main(models, args.out, args.json, plan, progress)


def run_compile(args: argparse.Namespace, argv: list[str], progress) -> int:
    """`--compile`: the compiled decode step against eager (engine/bench/compiled.py), on --model or its two defaults."""
    batches = (1, args.batch) if args.batch is not None else None  # --batch B: batch 1 and B only
    plan = compiled.CompilePlan(**{k: v for k, v in (("repeats", args.repeats), ("decode_tokens", args.decode_tokens),
                                            ("batches", batches)) if v is not None})  # fmt: skip
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    models = [args.model] if any(a.startswith("--model") for a in argv) else None  # default: 135M and chef
    return compiled.main(models, args.out, args.json, plan, progress)


if __name__ == "__main__":
    raise SystemExit(main())
