"""`python -m engine bench wait-policy`: what each OpenMP wait policy costs our decode, and a neighbour.

Between two parallel regions an OpenMP worker thread either sleeps (PASSIVE: the next region pays
a wake-up, tens of microseconds, ~30 times a step), spins for ever (ACTIVE: no wake-up, but the
core is never free for anything else), or spins a bounded number of times and then sleeps
(GNU OpenMP's GOMP_SPINCOUNT, read only when OMP_WAIT_POLICY is not PASSIVE). The app runs beside
a browser, so the question has two sides, and this measures both, each setting in a fresh process
(libgomp reads its environment once, when torch loads it):
  * our batch-1 decode tokens/s (engine/bench/peer_ours.py), alone and beside a neighbour;
  * the neighbour: one busy-loop process counting loop iterations per second, the stand-in for a
    browser's main thread, alone and beside our decode. Its rate beside us over its rate alone is
    the share of a core it kept.
Rounds alternate the order of the settings so slow drifts of the machine's load hit all alike.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

from engine.bench.contestants import random_prompts
from engine.bench.peer_ours import TimingSpec
from engine.bench.peers import Ours, run_ours, summary
from engine.bench.report import save_json
from engine.errors import EngineError, OneLineParser
from engine.presets import CHEF_DIR

# GOMP_SPINCOUNT counts only where the policy is not PASSIVE: the empty policy is libgomp's default
# (it warns once about the value), which `import engine` leaves alone because the variable is set.
SETTINGS = (
    Ours("PASSIVE", env=(("OMP_WAIT_POLICY", "PASSIVE"),)),
    Ours("ACTIVE", env=(("OMP_WAIT_POLICY", "ACTIVE"),)),
    Ours("spin 10k", env=(("OMP_WAIT_POLICY", ""), ("GOMP_SPINCOUNT", "10000"))),
    Ours("spin 100k", env=(("OMP_WAIT_POLICY", ""), ("GOMP_SPINCOUNT", "100000"))),
    Ours("PASSIVE, 1 thread", env=(("OMP_WAIT_POLICY", "PASSIVE"),), threads=1),
    Ours("default", env=None),  # what `import engine` chooses with nothing exported
)


def _spin(stop, conn) -> None:
    """The neighbour: busy loops, noting (wall time, loops done) every 100 loops until told to stop."""
    n, marks = 0, [(time.time(), 0)]
    while not stop.is_set():
        for _ in range(1_000):
            pass
        n += 1
        if n % 100 == 0:
            marks.append((time.time(), n))
    conn.send(marks)


class Neighbour:
    """A busy-loop process; after the block, `rate(t0, t1)` is its loops per second in that window."""

    def __enter__(self):
        ctx = mp.get_context("fork")
        self.stop = ctx.Event()
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_spin, args=(self.stop, send), daemon=True)
        self.proc.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.marks = self.recv.recv()
        self.proc.join(10)

    def rate(self, t0: float, t1: float) -> float:
        inside = [(t, n) for t, n in self.marks if t0 <= t <= t1]
        if len(inside) < 2:
            return 0.0
        (ta, na), (tb, nb) = inside[0], inside[-1]
        return (nb - na) / (tb - ta)


def neighbour_alone(seconds: float) -> float:
    with Neighbour() as nb:
        time.sleep(seconds)
    return nb.rate(nb.marks[0][0] + 0.5, nb.marks[-1][0])


def measure(folder: str, rounds: int, threads: int, new: int, progress) -> dict:
    prompt = random_prompts(json.loads((Path(folder) / "config.json").read_text())["vocab_size"], 1, 128, 2)[0]
    spec = TimingSpec(folder, threads=threads, decode_prompt=prompt, decode_new=new)
    alone: dict[str, list[float]] = {s.name: [] for s in SETTINGS}
    beside: dict[str, list[float]] = {s.name: [] for s in SETTINGS}
    kept: dict[str, list[float]] = {s.name: [] for s in SETTINGS}
    base_rates, loads = [], []
    for r in range(rounds):
        order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
        base_rates.append(neighbour_alone(3.0))
        for s in order:
            loads.append(os.getloadavg()[0])
            progress(f"round {r + 1}/{rounds}: {s.name} (load {loads[-1]:.2f})")
            alone[s.name].append(run_ours(s, spec)["decode_tps"])
            with Neighbour() as nb:
                got = run_ours(s, spec)
            beside[s.name].append(got["decode_tps"])
            kept[s.name].append(nb.rate(*got["decode_window"]) / statistics.median(base_rates))
    return {
        "model": folder, "threads": threads, "rounds": rounds, "decode_new": new,
        "env": {s.name: dict(s.env) if s.env else "nothing exported" for s in SETTINGS},
    "threads_of": {s.name: s.threads or threads for s in SETTINGS},
        "decode_tps_alone": {k: summary(v) for k, v in alone.items()},
        "decode_tps_beside_neighbour": {k: summary(v) for k, v in beside.items()},
        # the neighbour's loop rate during our timed decode, over its rate alone
        "neighbour_share_kept": {k: summary(v) for k, v in kept.items()},
        "neighbour_alone_rate": summary(base_rates),
        "load_average": {"min": min(loads), "max": max(loads)},
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="python -m engine bench wait-policy", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(CHEF_DIR), help="an HF folder (default: the chef)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", help="write the JSON here (default: print it)")
    try:
        args = p.parse_args(argv)
        if args.rounds < 1 or args.new_tokens < 2 or not 1 <= args.threads <= (os.cpu_count() or 1):
            raise EngineError(f"rounds >= 1, new tokens >= 2, threads 1..{os.cpu_count()} "
                              f"(got {args.rounds}, {args.new_tokens}, {args.threads})")  # fmt: skip
        report = measure(args.model, args.rounds, args.threads, args.new_tokens,
                         lambda m: print(f"[wait-policy] {m}", file=sys.stderr, flush=True))  # fmt: skip
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = save_json(report, args.out, indent=1)
    if not args.out:
        print(text)
    return 0
