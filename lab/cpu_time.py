"""Wall time and CPU time of every step: what the guest waited vs what the cook actually worked.

Why both: on a shared machine (a classroom server, a laptop running a video call, CI with
neighbours) the wall clock includes time our process spent *waiting for a core*. Those waits come
in bursts that last many steps, so a per-step latency curve can jump 5x for reasons that have
nothing to do with the model. The process's CPU time counts only the work our threads did, so it
shows the model's cost curve even when the machine is busy. The lab plots wall time (the user's
truth) and uses CPU time to state shape facts (flat vs growing) that must hold on any machine;
whether something else ran meanwhile is `lab.noise.MachineWatch`'s to say.

How: we run the order's stream (`lab.kitchens.stream`: the engine's seats, or a lesson's kitchen
built on the same forward) instead of `generate()`; it yields a `StepEnd` right after
each pass, in this thread, so `time.process_time()` read at consecutive `StepEnd`s brackets that
step's CPU work (plus the few microseconds of yielding its events).

Caveats, stated on the pages: with several torch threads, CPU time sums all of them (including
OpenMP threads spin-waiting), so it can exceed wall time; on a GPU it misses device work, so the
lab uses it only on CPU.

Example:
    run = generate_timed(engine, [ids], max_new_tokens=32, cache="none")
    run.result.trace.decode_steps[5].seconds, run.decode_cpu_s[5]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.events import Done, StepEnd
from lab.kitchens import stream


@dataclass(frozen=True)
class TimedRun:
    result: object  # engine.GenerationResult
    cpu_s: list[float]  # CPU seconds of each trace step, in trace order (prefill first)

    @property
    def prefill_cpu_s(self) -> float:
        return self.cpu_s[0]

    @property
    def decode_cpu_s(self) -> list[float]:
        return self.cpu_s[1:]


def generate_timed(engine, prompts, **settings) -> TimedRun:
    """`lab.kitchens.generate(engine, prompts, **settings)`, also recording each step's process CPU time."""
    cpu, result = [], None
    last = time.process_time()
    for event in stream(engine, prompts, **settings):
        if isinstance(event, StepEnd):
            now = time.process_time()
            cpu.append(now - last)
            last = now
        elif isinstance(event, Done):
            result = event.result
    return TimedRun(result=result, cpu_s=cpu)
