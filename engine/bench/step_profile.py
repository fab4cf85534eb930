"""`python -m engine bench step-profile`: where one batch-1 decode step of the serving core goes, in µs.

The Kitchen's pot is `Engine.step()` over the serving core. This times its parts on a real engine,
wall clock, by wrapping the methods that do each part on the loaded instances (nothing is mocked;
each wrapper costs well under a microsecond):

  schedule     the scheduler's plan (engine/scheduler.py)
  runner       the runner's bookkeeping around the pass: sorting the work, token and position
               lists, the seats' lengths (engine/runner.py `run` minus its pass)
  inputs       the pass's tensors: the write index, the mask bias, the host-to-device copy
               (`_forward` minus the model)
  model        the model's forward pass, or the step that replaces it: the native step (the
               default on CPU, engine/native.py) or the compiled one
  sample       the next token from the logits (Engine._sample)
  events       the rest of `step()`: Token, StepEnd and its StepRecord, the text decoder

Decode steps after a 128-token prompt, one request, greedy. The engine's settings (threads,
OpenMP's wait policy) are the process's: run it as the app runs (`--threads 1`, nothing exported).

`--ops N` adds one more round under torch.profiler and names the N operators with the most self
time, per step. That says what the `model` part is made of: the weight products (`aten::mm`) or
the small operators around them, and, compiled, the guards dynamo checks before each call. The
profiler adds its own cost to every operator it records, so read the shares, not the sums.
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

from engine.bench.report import save_json
from engine.errors import EngineError, OneLineParser

PARTS = ("schedule", "runner", "inputs", "model", "sample", "events")


class Timer:
    """Accumulates the wall time of the wrapped calls, per name, for the current step."""

    def __init__(self):
        self.now: dict[str, float] = {}

    def wrap(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr, None)
        if fn is None:  # an engine without that part (an older one, timed for an A/B)
            return

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.now[name] = self.now.get(name, 0.0) + time.perf_counter() - t

        setattr(obj, attr, timed)


def profile(model: str, steps: int, threads: int, compile_: bool, rounds: int, prompt_len: int = 128,
            ops: int = 0, native: bool = True) -> dict:  # fmt: skip
    torch.set_num_threads(threads)
    eng = engine.Engine.load(model, compile=compile_, native=native)
    prompt = [(7 * j) % eng.cfg.vocab_size for j in range(prompt_len)]
    t = time.perf_counter()
    eng.submit(prompt, 4, stop_at_eos=False)  # builds the serving core (and, compiled, compiles)
    while not eng.idle:
        eng.step()
    warmup_s = time.perf_counter() - t
    srv, timer = eng.serving, Timer()
    timer.wrap(srv.scheduler, "schedule", "schedule")
    fwd = srv.runner.forward
    timer.wrap(srv.runner, "run", "run")
    timer.wrap(srv.runner, "forward", "forward")  # the one dispatch: the native step's pass or the torch forward's
    if getattr(fwd, "decode_fn", None) is not None:  # the native step: its C call is the model's pass
        timer.wrap(fwd, "decode_fn", "model")
        timer.wrap(fwd, "pass_fn", "model")
    elif getattr(fwd, "decode_step", None) is not None:  # the compiled step, in place of the model's pass
        timer.wrap(fwd, "decode_step", "model")
    else:
        timer.wrap(srv.runner.model, "forward", "model")
    timer.wrap(eng, "_sample", "sample")
    per_round, fastest = [], None
    for _ in range(rounds):
        eng.submit(prompt, steps + 1, stop_at_eos=False)
        eng.step()  # the prefill
        parts: dict[str, list[float]] = {p: [] for p in (*PARTS, "step")}
        while not eng.idle:
            timer.now = {}
            t = time.perf_counter()
            eng.step()
            total = time.perf_counter() - t
            n = timer.now | {"forward": timer.now.get("forward", 0.0)}
            parts["schedule"].append(n["schedule"])
            parts["runner"].append(n["run"] - n["forward"])
            parts["inputs"].append(n["forward"] - n["model"])
            parts["model"].append(n["model"])
            parts["sample"].append(n["sample"])
            parts["events"].append(total - n["schedule"] - n["run"] - n["sample"])
            parts["step"].append(total)
            if fastest is None or total < fastest["step"]:
                fastest = {p: v[-1] for p, v in parts.items()}
        per_round.append({p: statistics.median(v) * 1e6 for p, v in parts.items()})
    top = op_profile(eng, prompt, steps, ops) if ops else None
    return {
        "model": model, "threads": torch.get_num_threads(), "compile": compile_, "steps": steps, "prompt_tokens": prompt_len,
        "native": eng.native is not None and eng.native.ready,
        "warmup_s": warmup_s,  # the first request: 1 prefill and 3 decode steps (compiled: the compile)
        "omp_wait_policy_in_effect": engine.OMP_WAIT_POLICY_IN_EFFECT, "load_average": list(os.getloadavg()),
        "us_median_of_rounds": {p: statistics.median(r[p] for r in per_round) for p in (*PARTS, "step")},
        "rounds_us": per_round,
        # The least disturbed step whole: its parts add up to it (each part's median above comes
        # from its own step, so on a busy machine those medians need not add up to the step's).
        "fastest_step_us": {p: v * 1e6 for p, v in fastest.items()},
        "ops_per_step": top,
    }  # fmt: skip


def op_profile(eng, prompt: list[int], steps: int, n: int) -> dict:
    """One more round of `steps` decode steps under torch.profiler: the `n` operators with the most
    self CPU time, in µs and calls per step, and the step's whole time as the profiler saw it."""
    from torch.profiler import ProfilerActivity  # lazy: only an operator profile needs the profiler
    from torch.profiler import profile as torch_profile  # lazy: as above

    eng.submit(prompt, steps + 1, stop_at_eos=False)
    eng.step()  # the prefill, outside the profile
    t = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        while not eng.idle:
            eng.step()
    step_us = (time.perf_counter() - t) / steps * 1e6
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:n]
    return {
        "step_us_under_profiler": step_us,
        "top": [{"op": e.key, "self_us": e.self_cpu_time_total / steps, "calls": e.count / steps} for e in rows],
    }


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="python -m engine bench step-profile", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="chef", help="model folder or preset: name (default the chef)")
    p.add_argument("--steps", type=int, default=128, help="decode steps per round (default 128)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; each part's median step, median over rounds")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, the Kitchen's)")
    p.add_argument("--compile", action="store_true", help="the compiled decode step (engine/compiled.py)")
    p.add_argument("--op-by-op", action="store_true", help="the model's forward one torch op at a time, not the native step")
    p.add_argument("--ops", type=int, default=0, help="also name the N operators with the most self time (torch.profiler)")
    p.add_argument("--out", help="also write the JSON here")
    try:
        args = p.parse_args(argv)
        if args.ops < 0:
            raise EngineError(f"--ops must be 0 or more (got {args.ops})")
        report = profile(args.model, args.steps, args.threads, args.compile, args.rounds, ops=args.ops,
                         native=not args.op_by_op)  # fmt: skip
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = save_json(report, args.out, indent=1)
    med = report["us_median_of_rounds"]
    print("  ".join(f"{k} {v:.1f}" for k, v in med.items()), "µs", file=sys.stderr)
    for row in (report["ops_per_step"] or {}).get("top", []):
        print(f"  {row['op']:<48} {row['self_us']:9.1f} µs  {row['calls']:6.1f} calls a step", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
