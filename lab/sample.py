"""One real run kept whole inside an experiment's result, for the inspector and the trace table.

Why keep it: every experiment page ends with the inspector's verdict, and the inspector reads a
run's `Metrics` and `Trace`. Each experiment keeps one representative run (the largest setting it
measured) instead of only its summary numbers, so the verdict rests on a real trace.

Named `sample` (never `metrics`/`trace` at the top of a result) so the app's run log, which records
anything that looks like a single generation, does not mistake a whole sweep for one order.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.trace import Metrics, Trace


@dataclass(frozen=True)
class Sample:
    label: str  # which setting this run was ("batch 64", "prompt 512 tokens")
    metrics: Metrics
    trace: Trace


def sample_of(result, label: str) -> Sample:
    """Keep the metrics and trace of an `engine.GenerationResult`."""
    return Sample(label=label, metrics=result.metrics, trace=result.trace)
