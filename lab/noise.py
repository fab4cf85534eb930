"""Honest under noise: every sweep point is a median with its spread, and a finding needs to beat it.

Why: on a shared machine (a classroom server, a laptop in a video call, two cores with neighbours)
one repeat can take twice as long as the next. A sweep that draws single values, or medians without
their spread, turns that noise into "findings" (a TTFT that falls as the prompt grows, "the wok is
full from 256"). So each point keeps the median of its repeats and their range (`Spread`), the
charts draw the range as error bars, and a conclusion is stated only where the effect is larger than
the spread (`clearly_apart`); otherwise the page says it is too noisy to say, and why.

What else ran: `MachineWatch` wraps one measurement with the Kitchen's own meter
(`serving.device_lock.CoreMeter`: the CPU time the engine's cores spent on anything but the engine and
the process that started it) and the machine's load average, so each Lab result says when other
work used the engine's cores while it was measured. It runs inside the engine's process: the
engine's cores are this process's own (`os.sched_getaffinity`), and the process that started it is
the kitchen server (or the test, or the recording script).

Example:
    watch = MachineWatch()
    ttft = spread_of([0.070, 0.048, 0.071])   # Spread(median=0.070, low=0.048, high=0.071, n=3)
    machine = watch.finish()                   # Machine(line=None or "something else used ...", load=...)
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import median

from serving.device_lock import CoreMeter

MIN_REPEATS = 3  # a median of fewer than three is one lucky or unlucky run


@dataclass(frozen=True)
class Spread:
    """The repeats of one sweep point: their median (what is plotted) and their range (the error bar)."""

    median: float
    low: float
    high: float
    n: int

    def scaled(self, factor: float) -> Spread:
        """The same spread in other units (s -> ms: 1e3), or of a rate computed as factor / value."""
        return Spread(self.median * factor, self.low * factor, self.high * factor, self.n)

    def inverse(self, numerator: float) -> Spread:
        """The spread of numerator / value (a time's spread as a rate's): the order of low and high flips."""
        inv = [numerator / v if v > 0 else 0.0 for v in (self.median, self.high, self.low)]
        return Spread(inv[0], inv[1], inv[2], self.n)


def spread_of(values: Sequence[float]) -> Spread:
    """Median, min and max of the repeats. Example: [3, 1, 2] -> Spread(2, 1, 3, n=3)."""
    vals = [float(v) for v in values]
    if not vals:
        return Spread(0.0, 0.0, 0.0, 0)
    return Spread(float(median(vals)), min(vals), max(vals), len(vals))


def clearly_apart(a: Spread, b: Spread) -> bool:
    """True when the two points' ranges do not overlap: the difference is larger than the noise."""
    return a.high < b.low or b.high < a.low


def error_bars(spreads: Sequence[Spread], factor: float = 1.0) -> dict:
    """Plotly's `error_y` (or `error_x`) for these points: from each median down to low, up to high."""
    return dict(
        type="data",
        symmetric=False,
        array=[(s.high - s.median) * factor for s in spreads],
        arrayminus=[(s.median - s.low) * factor for s in spreads],
        thickness=1.5,
        width=4,
    )


SPREAD_LEGEND = "bars: fastest to slowest of the repeats"


@dataclass(frozen=True)
class Machine:
    """What else ran while a result was measured: the Kitchen's meter's line, and the load average."""

    line: str | None  # None when nothing else used the engine's cores (or it cannot be told here)
    load: float  # the machine's 1-minute load average (the higher of start and end)
    cores: int  # how many cores the engine had
    wall_s: float

    @property
    def busy(self) -> bool:
        return self.line is not None

    def summary(self) -> str:
        """One line for the page, busy or not."""
        if self.line:
            return f"While this was measured, {self.line} (load average {self.load:.1f} on {self.cores} core(s))."
        return (f"Nothing else used the engine's {self.cores} core(s) while this was measured "
                f"(load average {self.load:.1f}).")

    def too_noisy(self, what: str) -> str:
        """The line a page shows instead of a conclusion the spread does not allow."""
        why = f"the machine was busy (load {self.load:.1f})" if self.busy else (
            f"the repeats vary more than the effect (load {self.load:.1f})")
        return f"too noisy to say {what}; {why}. More repeats, or a quieter machine, can tell"


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # Windows has no load average
        return 0.0


def _engine_cores() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


class MachineWatch:
    """Started before a measurement, finished after it: `Machine` says what else ran meanwhile."""

    def __init__(self) -> None:
        self.cores = _engine_cores()
        self.t0 = time.monotonic()
        self.load0 = _load()
        # The Kitchen's meter subtracts the engine's process and the one that started it; here this
        # process is the engine and its parent the server, so the roles swap and the sum is the same.
        self.meter = CoreMeter(self.cores, os.getppid())

    def stamp(self, result):
        """The result (a dataclass with a `machine` field) with this watch's finding on it."""
        return replace(result, machine=self.finish())

    def finish(self) -> Machine:
        line = self.meter.verdict()
        if line:  # the Kitchen's words are about an order; its seconds are summed over the cores
            line = re.sub(r"for ([\d.]+) s of this order's ([\d.]+) s",
                          rf"for \1 core-seconds of this measurement's \2 s on {len(self.cores)} core(s)", line)
        return Machine(line=line, load=max(self.load0, _load()), cores=len(self.cores),
                       wall_s=time.monotonic() - self.t0)
