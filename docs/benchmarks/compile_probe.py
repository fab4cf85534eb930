"""Probe: which granularity of torch.compile pays for the decode step (docs/benchmarks/compiled-cpu.md).

Three ways of running the serving runner's pure-decode step, in alternating rounds:
  eager   Transformer.forward_seats, as without compile=True
  layer   one compiled function of a layer's weights, called once per layer (30 calls a step)
  step    the whole step (every layer, final norm and LM head) as ONE compiled function, as kept

TPOT of `generate()` (an order on seats: 64-token prompts, 16 new tokens), 6 rounds, medians and
minima; the first run of each (the compile) is timed apart.

    PYTHONPATH=. .venv/bin/python docs/benchmarks/compile_probe.py [MODEL] [BATCH ...]
"""

import statistics
import sys
import time

import torch

from engine import Engine
from engine.compiled import CompiledDecode


def main() -> None:
    torch.set_num_threads(2)
    model = sys.argv[1] if len(sys.argv) > 1 else "preset:smollm2-135m"
    batches = [int(b) for b in sys.argv[2:]] or [1, 32]
    eng = Engine.load(model)
    ways = {
        "eager": None,
        "layer": CompiledDecode(eng.model, "layer"),
        "step": CompiledDecode(eng.model, "step"),
    }
    prompt = list(range(5, 69))

    def tpot(way: str, batch: int) -> float:
        eng.compiled = ways[way]
        return eng.generate([prompt] * batch, max_new_tokens=16, stop_at_eos=False).metrics.tpot_s

    for way in ways:
        for b in batches:
            t0 = time.perf_counter()
            tpot(way, b)
            print(f"{way} batch {b}: first run (compile) {time.perf_counter() - t0:.1f} s", flush=True)
    for b in batches:
        runs = {w: [] for w in ways}
        for r in range(6):
            for way in list(ways) if r % 2 == 0 else list(reversed(ways)):
                runs[way].append(tpot(way, b))
        summary = {
            k: f"median {statistics.median(v) * 1e3:.2f} ms, min {min(v) * 1e3:.2f} ms"
            for k, v in runs.items()
        }
        print(model, "batch", b, summary, flush=True)
    print("failures", {k: v.failure for k, v in ways.items() if v is not None})


if __name__ == "__main__":
    main()
