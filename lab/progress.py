"""Progress and ETA for lab sweeps, plus the repeat-and-take-the-median rule every sweep uses.

Why an ETA from work units, not from point counts: a sweep's points are not equal. In the banquet,
a 1,024-token prompt costs ~30x a 32-token one, so "3 of 8 done" badly overstates how far along
we are. Each point declares its expected cost in `units` (tokens processed, say); the ETA is the
measured pace so far applied to the units left:

    eta = elapsed x (units_left / units_done)

Worked example: points cost 1, 2, 4, 8 units; after the first two (3 units) took 0.6 s, the ETA
is 0.6 x 12 / 3 = 2.4 s. No pace is assumed before the first point finishes (ETA = None).

Compute functions call `tracker.step(label)` after each point; the tracker calls `on_progress`
with a `Progress` record, which the page's worker callback appends to the job's events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True)
class Progress:
    done: int  # points finished
    total: int
    label: str  # what just finished, in words ("prompt 512 tokens")
    fraction: float  # of the work units, 0..1
    elapsed_s: float
    eta_s: float | None  # None until the pace is known

    def line(self) -> str:
        eta = f"about {self.eta_s:.0f} s left" if self.eta_s is not None else "estimating time left"
        return f"{self.done}/{self.total}: {self.label} ({eta})"


ProgressFn = Callable[[Progress], None]


def ignore_progress(_: Progress) -> None:
    """The default `on_progress` for callers that do not show a bar (tests, scripts)."""


class ProgressTracker:
    """Counts finished points of a sweep and reports fraction done and an ETA from the pace so far."""

    def __init__(self, units: Sequence[float], on_progress: ProgressFn | None = None):
        self.units = [max(float(u), 1e-9) for u in units]
        self.on_progress = on_progress or ignore_progress
        self.done = 0
        self.t0 = time.perf_counter()

    @property
    def total_units(self) -> float:
        return sum(self.units)

    def step(self, label: str) -> Progress:
        self.done = min(self.done + 1, len(self.units))
        done_units = sum(self.units[: self.done])
        elapsed = time.perf_counter() - self.t0
        left = self.total_units - done_units
        eta = elapsed * left / done_units if done_units > 0 and elapsed > 0 else None
        record = Progress(
            done=self.done,
            total=len(self.units),
            label=label,
            fraction=done_units / self.total_units if self.total_units else 1.0,
            elapsed_s=elapsed,
            eta_s=eta,
        )
        self.on_progress(record)
        return record


def median_of(values: Sequence[float]) -> float:
    """The median, the lab's summary of repeats: one slow outlier on a shared machine cannot move it."""
    return float(median(values)) if values else 0.0
