"""Probe: torch.compile of RMSNorm and RoPE inside the decode step, A/B against eager (int8-cpu.md).

The SmolLM2-135M preset shape (int8 weights with `int8`), 16-token generations after a 64-token
prompt; the compiled functions (inductor, `dynamic=True`) are swapped into engine.model for one
run and out for the next, 8 alternating rounds, medians and minima of TPOT.

    PYTHONPATH=. .venv/bin/python docs/benchmarks/fuse_probe.py [int8]
"""

import statistics
import sys
import time

import torch

import engine.model as model_mod
from engine import Engine


def main() -> None:
    torch.set_num_threads(2)
    quant = sys.argv[1] if len(sys.argv) > 1 else None
    eng = Engine.load("preset:smollm2-135m", quant=quant)
    eager = {"rms_norm": model_mod.rms_norm, "apply_rope": model_mod.apply_rope}
    fused = {name: torch.compile(fn, dynamic=True) for name, fn in eager.items()}
    prompt = [list(range(5, 69))]

    def tpot(fns: dict) -> float:
        for name, fn in fns.items():
            setattr(model_mod, name, fn)
        return eng.generate(prompt, max_new_tokens=16, stop_at_eos=False).metrics.tpot_s

    t0 = time.perf_counter()
    tpot(fused)
    print(f"compile and first run: {time.perf_counter() - t0:.1f} s", flush=True)
    tpot(eager)
    runs = {"eager": [], "compiled": []}
    for r in range(8):
        for name in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            runs[name].append(tpot(eager if name == "eager" else fused))
    tpot(eager)
    print(quant, {k: f"median {statistics.median(v) * 1e3:.2f} ms, min {min(v) * 1e3:.2f} ms" for k, v in runs.items()})


if __name__ == "__main__":
    main()
