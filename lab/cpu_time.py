"""Wall time and CPU time of every step: what the guest waited vs what the cook actually worked.

Why both: on a shared machine (a classroom server, a laptop running a video call, CI with
neighbours) the wall clock includes time our process spent *waiting for a core*. Those waits come
in bursts that last many steps, so a per-step latency curve can jump 5x for reasons that have
nothing to do with the model. The process's CPU time counts only the work our threads did, so it
shows the model's cost curve even when the machine is busy. The lab plots wall time (the user's
truth) and uses CPU time to state shape facts (flat vs growing) that must hold on any machine.

How: we run `engine.stream()` instead of `generate()`; the engine yields a `StepEnd` right after
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
    """`engine.generate(prompts, **settings)`, also recording each step's process CPU time."""
    cpu, result = [], None
    last = time.process_time()
    for event in engine.stream(prompts, **settings):
        if isinstance(event, StepEnd):
            now = time.process_time()
            cpu.append(now - last)
            last = now
        elif isinstance(event, Done):
            result = event.result
    return TimedRun(result=result, cpu_s=cpu)


BUSY_BELOW = 0.7  # our CPU time under 70 % of the wall time: the machine was busy


def busy_note(wall_s: float, cpu_s: float, device: str) -> str | None:
    """A warning line when the process got the CPU for only part of the measured wall time.

    Single-threaded work on an idle machine has CPU time ~= wall time. Much less means the process
    sat waiting for a core, so wall-clock figures include other people's work. (With several torch
    threads CPU time can exceed wall time; that never triggers the warning.)
    """
    if not str(device).startswith("cpu") or wall_s <= 0:
        return None
    share = cpu_s / wall_s
    if share >= BUSY_BELOW:
        return None
    return (
        f"this machine was busy: our process had the CPU for {share:.0%} of the measured wall time, so "
        "wall-clock figures include waiting for a core; CPU-time figures do not"
    )
