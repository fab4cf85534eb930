"""`python -m engine bench native-sweep`: the native step against the model's forward op by op, by batch.

Why: engine/native.py runs every pass natively, NATIVE_GROUP rows at a time. Whether that is right
at every batch is a measurement: at batch 1 the step is bandwidth and overhead, at large batches
it is arithmetic, where torch's GEMM (MKL) would win if the native step's products were slower.

For each batch B, one order of B prompts (`--prompt` tokens each) and `--new` tokens is cooked
through `generate()` natively and op by op (`native=False`), alternating, `--rounds` times after a
warm-up; a round's number is the median decode step of its trace (wall clock, the Kitchen's TPOT).
The JSON has every sample; the ratio is op-by-op step / native step (above 1: native is faster).
Threads: the process's (`--threads`, default 1, the Kitchen's engine on a 2-core machine).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

# isort: off
import engine  # first: it sets the engine's OpenMP defaults before torch loads (engine/__init__.py)
import torch
# isort: on

from engine.bench.contestants import machine_facts, random_prompts
from engine.bench.report import save_json
from engine.errors import EngineError, OneLineParser


def step_ms(eng, prompts: list[list[int]], new: int, native: bool) -> float:
    res = eng.generate(prompts, max_new_tokens=new, temperature=0.0, stop_at_eos=False, native=native)
    return statistics.median(s.seconds for s in res.trace.decode_steps) * 1e3


def sweep(model: str, quant: str | None, batches: list[int], prompt: int, new: int, rounds: int) -> dict:
    eng = engine.Engine.load(model, quant=quant)
    if eng.native is None or not eng.native.ready:
        raise EngineError(f"the native step does not run here: {eng.native.problem if eng.native else 'not on CPU'}")
    rows = []
    for b in batches:
        prompts = random_prompts(eng.cfg.vocab_size, b, prompt, seed=b)
        for native in (True, False):  # warm-up: first allocations, first pages of the seats
            step_ms(eng, prompts, 4, native)
        native_ms, forward_ms = [], []
        for r in range(rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for native in order:
                (native_ms if native else forward_ms).append(step_ms(eng, prompts, new, native))
        n, f = statistics.median(native_ms), statistics.median(forward_ms)
        rows.append({"batch": b, "native_step_ms": n, "op_by_op_step_ms": f, "ratio": f / n,
                     "native_samples": native_ms, "op_by_op_samples": forward_ms,
                     "native_tokens_per_s": b / n * 1e3})  # fmt: skip
        print(f"[native-sweep] {model} {quant or 'fp32'} batch {b}: native {n:.2f} ms, op by op {f:.2f} ms "
              f"({f / n:.2f}x)", file=sys.stderr, flush=True)  # fmt: skip
    return {"model": model, "quant": quant, "prompt_tokens": prompt, "new_tokens": new, "rounds": rounds,
            "threads": torch.get_num_threads(), "omp_wait_policy_in_effect": engine.OMP_WAIT_POLICY_IN_EFFECT,
            "load_average_end": list(os.getloadavg()), "machine": machine_facts(),
            "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}  # fmt: skip


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="python -m engine bench native-sweep", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="chef", help="model (default the chef)")
    p.add_argument("--quant", choices=["int8"], help="int8 weights")
    p.add_argument("--batches", default="1,2,4,8,16,32,64", help="comma-separated batch sizes")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per row (default 32)")
    p.add_argument("--new", type=int, default=33, help="new tokens per row (default 33: 32 decode steps)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, the Kitchen's)")
    p.add_argument("--out", help="also write the JSON here")
    try:
        args = p.parse_args(argv)
        batches = [int(b) for b in args.batches.split(",")]
        if any(b < 1 for b in batches) or args.rounds < 1 or args.new < 3 or args.prompt < 1 or args.threads < 1:
            raise EngineError("batches, --prompt, --rounds and --threads must be at least 1, --new at least 3")
        torch.set_num_threads(args.threads)
        report = sweep(args.model, args.quant, batches, args.prompt, args.new, args.rounds)
    except (EngineError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(save_json(report, args.out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
