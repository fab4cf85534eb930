"""Does batch-invariant mode cost the default decode step anything while it is off?

The mode adds three checks to the default path: one per step in `Runner.run`, one per pass in
`Runner._kv`, and one per layer in `SeatKV.attend` (engine/runner.py, engine/attention.py). This
times the default serving step with those methods as they are (B) against the same methods with
the checks taken out (A), in ONE process and one engine, switching the methods between orders, so
the machine's drift from minute to minute falls on both sides alike. A second pair of sides runs
the same code twice (A/A): the noise the A/B is read against.

Chef, float32, 1 thread (the Kitchen's), greedy, a 128-token prompt then `--new` decode steps;
each order's TPOT is the median of its steps' wall times.

    PYTHONPATH=. .venv/bin/python docs/benchmarks/off_mode_ab.py --rounds 40 --out docs/benchmarks/off-mode-ab.json
"""

# ruff: noqa: E402
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import engine  # first: the engine's OpenMP defaults before torch loads
from engine.attention import SeatKV, decode_attention
from engine.bench.report import paired, save_json
from engine.runner import Runner

WITH_CHECKS = {"run": Runner.run, "_kv": Runner._kv, "attend": SeatKV.attend}


def _kv_without(self, sb, decode_pos):
    return SeatKV(sb, self.pool)


def _attend_without(self, layer, q, k, v):
    """SeatKV.attend's pure-decode branch (the only one a batch-1 decode step takes), no mode check."""
    sb, pool, nd = self.sb, self.pool, self.sb.n_decode
    if sb.uniform or sb.spans:
        return WITH_CHECKS["attend"](self, layer, q, k, v)
    pool.write_rows(layer, sb.decode_index, k[:, :, 0], v[:, :, 0])
    keys, values = pool.read_rows(layer, sb.decode_first, nd, sb.decode_width)  # (B, Hkv, W, D)
    return decode_attention(q, keys, values, sb.decode_bias)  # (B, 1, H*D)


@torch.inference_mode()
def _run_without(self, plan):
    if (
        self.decode_in is not None
        and self.graphs is None
        and all(w.is_decode and not w.draft for w in plan.work)
    ):
        return self._run_decode(plan.work)
    return WITH_CHECKS["run"](self, plan)


WITHOUT_CHECKS = {"run": _run_without, "_kv": _kv_without, "attend": _attend_without}


def use(methods: dict) -> None:
    Runner.run, Runner._kv, SeatKV.attend = methods["run"], methods["_kv"], methods["attend"]


def order_tpot(eng, prompt: list[int], new: int) -> float:
    eng.submit(prompt, new, stop_at_eos=False)
    steps = []
    while not eng.idle:
        t = time.perf_counter()
        eng.step()
        steps.append(time.perf_counter() - t)
    return statistics.median(steps[1:])  # the first step is the prefill


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    eng = engine.Engine.load("chef")
    prompt = [(7 * j) % eng.cfg.vocab_size for j in range(128)]
    order_tpot(eng, prompt, 8)  # builds the serving core
    sides = {"without": [], "with": [], "with_again": []}
    plan = {"without": WITHOUT_CHECKS, "with": WITH_CHECKS, "with_again": WITH_CHECKS}
    t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in range(args.rounds):
        names = list(sides)
        random.Random(r).shuffle(names)  # each round its own order of the three sides
        for name in names:
            use(plan[name])
            sides[name].append(order_tpot(eng, prompt, args.new))
    use(WITH_CHECKS)
    report = {
        "what": "default decode step with batch-invariant mode's checks (with) vs without them, one process",
        "model": "chef", "threads": 1, "prompt_tokens": 128, "new_tokens": args.new, "rounds": args.rounds,
        "started_utc": t0, "tpot_s": sides,
        "ab": paired(sides["without"], sides["with"]),  # paired_median, paired_ci95
        "aa": paired(sides["with"], sides["with_again"]),
        "median_ms": {k: statistics.median(v) * 1e3 for k, v in sides.items()},
    }  # fmt: skip
    for name in ("ab", "aa"):
        p = report[name]
        print(
            f"{name}: {p['paired_median']:+.2%} (95 % {p['paired_ci95'][0]:+.2%} to {p['paired_ci95'][1]:+.2%})"
        )
    print(f"medians (ms): {report['median_ms']}")
    save_json(report, str(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
