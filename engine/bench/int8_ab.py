"""`python -m engine.bench.int8_ab MODEL REPEATS TOKENS OUT.json`: int8 decode kernels A/B, batch 1, 1 thread.

Six engines over one model, loaded side by side in one process: float32, int8 with its W8A8
decode kernel, int8 with the W8A16 kernel (as on a torch without fbgemm: no pack at load), each
eager and compiled. Every repeat times each once (TPOT of TOKENS greedy tokens after a 64-token
prompt), in an order rotated by one per repeat, after an untimed warm-up that pays the compiles;
then each makes 256 greedy tokens for the agreement with float32. Medians, with the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

import torch

from engine import Engine, int8_op
from engine.bench.contestants import common_prefix, random_prompts, reference_folder


def load_all(folder: str) -> dict:
    engines = {}
    for compiled in (False, True):
        sfx = "_compiled" if compiled else ""
        engines["fp32" + sfx] = Engine.load(folder, compile=compiled)
        engines["int8_w8a8" + sfx] = Engine.load(folder, quant="int8", compile=compiled)
        int8_op._W8A8_WORKS["cpu"] = False  # the probe's "no": this engine packs nothing and runs W8A16
        engines["int8_w8a16" + sfx] = Engine.load(folder, quant="int8", compile=compiled)
        int8_op._W8A8_WORKS.pop("cpu")  # the next load probes again
    return engines


def main(model: str, repeats: int, tokens: int, out: str) -> int:
    torch.set_num_threads(1)
    report = {"model": model, "threads": 1, "tokens": tokens, "load_average": list(os.getloadavg())}
    with tempfile.TemporaryDirectory() as workdir:
        engines = load_all(reference_folder(model, workdir))
    prompt = random_prompts(engines["fp32"].cfg.vocab_size, 1, 64, seed=2)
    order, samples = list(engines), {v: [] for v in engines}

    def tpot(v: str) -> float:
        return engines[v].generate(prompt, max_new_tokens=tokens, temperature=0.0, stop_at_eos=False).metrics.tpot_s

    with torch.inference_mode():
        for v in order:
            tpot(v)
        for i in range(repeats):
            for v in order[i % len(order) :] + order[: i % len(order)]:
                samples[v].append(tpot(v))
        n = min(256, engines["fp32"].cfg.max_context - 64)
        runs = {v: e.generate(prompt, max_new_tokens=n, stop_at_eos=False).tokens[0] for v, e in engines.items()}
    report["load_average_after"] = list(os.getloadavg())
    report["tpot_ms"] = {v: {"median": statistics.median(s) * 1e3, "samples": [x * 1e3 for x in s]}
                         for v, s in samples.items()}  # fmt: skip
    report["agreement_with_fp32"] = {v: {"tokens": n, "common_prefix": common_prefix(runs["fp32"], r),
                                         "positions_equal": sum(a == b for a, b in zip(runs["fp32"], r, strict=True))}
                                     for v, r in runs.items()}  # fmt: skip
    report["compiled_steps"] = {v: e.compiled.steps for v, e in engines.items() if e.compiled is not None}
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    for v, t in report["tpot_ms"].items():
        print(f"{v:20s} {t['median']:8.2f} ms  {1e3 / t['median']:7.1f} tok/s  {report['agreement_with_fp32'][v]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
