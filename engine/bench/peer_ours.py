"""Our engine in one configuration, timed in a process of its own: `python -m engine.bench.peer_ours SPEC_JSON`.

Why a process per round: OpenMP reads its wait policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT) once, when
torch loads it, so each setting needs a fresh interpreter with its environment set before `engine`
(and with it torch) is imported. A process per round also means no contestant sits idle with
spinning threads while the other one is timed.

The spec (a JSON object, `TimingSpec`'s fields) says what to load and what to time; the answer is one JSON
line on stdout: tokens/s of batch-1 decode, of prefill and of batched decode, and the greedy tokens
of the agreement prompt. A warm-up run of each measurement comes first (a compiled step compiles
there), so the timed runs see warm caches like llama-bench's.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

# isort: off
import engine  # first: it sets the engine's OpenMP defaults before torch loads (engine/__init__.py)
import torch
# isort: on

from engine.bench.ceilings import measure_ceilings


@dataclass(frozen=True)
class TimingSpec:
    """What one timing process loads and times; its JSON is the process's one argument."""

    folder: str  # what Engine.load takes: the HF folder llama.cpp's GGUF came from, or that GGUF itself
    quant: str | None = None  # None or "int8"
    compile: bool = False
    native: bool = True  # the native step (engine/native.py), the engine's CPU default
    threads: int = 1
    decode_prompt: list[int] | None = None  # batch-1 decode: these ids, then `decode_new` tokens
    decode_new: int = 128
    prefill_prompt: list[int] | None = None  # one prompt, timed as one prefill pass
    batch_prompts: list[list[int]] | None = None  # batched decode: these prompts together
    batch_new: int = 32
    greedy_prompt: list[int] | None = None  # agreement: its greedy continuation of `greedy_new` tokens
    greedy_new: int = 32
    ceilings: bool = False  # also time the kernel-only chains (engine/bench/ceilings.py) on the loaded weights


def run(spec: TimingSpec) -> dict:
    torch.set_num_threads(spec.threads)
    eng = engine.Engine.load(spec.folder, quant=spec.quant, compile=spec.compile, native=spec.native)
    greedy = dict(temperature=0.0, stop_at_eos=False)
    out: dict = {"omp_wait_policy_in_effect": engine.OMP_WAIT_POLICY_IN_EFFECT, "threads": torch.get_num_threads()}
    if spec.greedy_prompt:
        res = eng.generate([spec.greedy_prompt], max_new_tokens=spec.greedy_new, **greedy)
        out["greedy_tokens"] = res.tokens[0]
    if spec.decode_prompt:
        for _ in range(2):  # warm-up, then the timed run
            t0 = time.time()
            res = eng.generate([spec.decode_prompt], max_new_tokens=spec.decode_new + 1, **greedy)
        out["decode_tps"] = res.metrics.decode_tps  # decode_new steps after the prompt's first token
        out["decode_window"] = [t0, time.time()]  # wall clock of the timed run (a neighbour's rate over it)
    if spec.prefill_prompt:
        for _ in range(2):
            res = eng.generate([spec.prefill_prompt], max_new_tokens=1, **greedy)
        out["prefill_tps"] = res.metrics.prefill_tps
    if spec.batch_prompts:
        for _ in range(2):
            res = eng.generate(spec.batch_prompts, max_new_tokens=spec.batch_new + 1, **greedy)
        out["batch_decode_tps"] = res.metrics.decode_tps
    if spec.ceilings:
        prefill = len(spec.prefill_prompt or [0] * 512)
        batch = len(spec.batch_prompts or [[0]] * 32)
        c = measure_ceilings(eng.model, prefill, (1, batch), repeats=5)
        out["ceiling_decode_tps"] = 1 / c["decode_step_s"]["b1"]
        out["ceiling_batch_decode_tps"] = batch / c["decode_step_s"][f"b{batch}"]
        out["ceiling_prefill_tps"] = prefill / c["prefill_s"]
        if c["native_decode_step_s"]:
            out["ceiling_native_decode_tps"] = 1 / c["native_decode_step_s"]["b1"]
            out["ceiling_native_batch_decode_tps"] = batch / c["native_decode_step_s"][f"b{batch}"]
            out["ceiling_native_prefill_tps"] = prefill / c["native_prefill_gemm_s"]
    if eng.native is not None:
        out["native_steps"], out["native_problem"] = eng.native.steps, eng.native.problem
    if eng.compiled is not None:
        out["compiled_steps"], out["compile_failure"] = eng.compiled.steps, eng.compiled.failure
    return out


def spec_json(spec: TimingSpec) -> str:
    return json.dumps(asdict(spec))


if __name__ == "__main__":
    print(json.dumps(run(TimingSpec(**json.loads(sys.argv[1])))), flush=True)
