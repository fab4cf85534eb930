"""What else ran while the engine cooked: the engine's core and the browser's CPU, for the UI bench.

Two instruments for scripts/ui_overhead_bench.py (`--perf`), on both sides of every round:

  CoreProbe     `perf record -e sched:sched_switch` on the engine's core: who held it during the
                cook, for how long and how often (`cook_span_holders` reads perf's log)
  BrowserMeter  every Chromium process's CPU seconds, sampled from the harness ten times a second;
                the cook's span from perf (the same monotonic clock) cuts the samples

Linux only (perf). Nothing here imports torch or the engine.
"""

from __future__ import annotations

import bisect
import re
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil


def browser_pids() -> list[int]:
    """Every process named after Chromium (its browser, renderers, GPU and utility processes)."""
    return [p.pid for p in psutil.process_iter(["name"]) if "chrom" in (p.info["name"] or "")]


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far; one that ended counts no more."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a process that ended meanwhile
            continue
    return total


class BrowserMeter:
    """The browser's CPU use over time: (monotonic time, CPU seconds so far) every SAMPLE_S, from a
    thread of the harness (on the server's cores). `cores_busy(lo, hi)` is the browser's CPU seconds
    per second between two instants (the cook's span, from perf on the same clock), interpolated."""

    SAMPLE_S = 0.1

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        pids, self.samples = browser_pids(), []
        self._stop.clear()

        def sample():
            while True:
                self.samples.append((time.monotonic(), cpu_s(pids)))
                if self._stop.wait(self.SAMPLE_S):
                    return

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def cores_busy(self, lo: float, hi: float) -> float | None:
        if hi <= lo or len(self.samples) < 2 or not self.samples[0][0] <= lo < hi <= self.samples[-1][0]:
            return None
        return round((self._at(hi) - self._at(lo)) / (hi - lo), 4)

    def _at(self, t: float) -> float:
        """CPU seconds at instant t, linear between the two samples around it."""
        i = bisect.bisect_right(self.samples, t, key=lambda s: s[0])
        (t0, c0), (t1, c1) = self.samples[max(i - 1, 0)], self.samples[min(i, len(self.samples) - 1)]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


class CoreProbe:
    """Who held the engine's core while an order cooked, from the kernel's context switches.

    `perf record -e sched:sched_switch` on the engine's core(s) logs every switch (who left, who
    came in, when), so each task's time on the core is exact and perf adds no interrupts of its
    own (2 kHz sampling did: it cost the live side +24 % by itself). The cook is the longest
    stretch of the engine's time on the core with no gap over 10 ms; each round reports its span,
    the engine's share of it, how often another task took the core, for how long in all, and who.
    Run on both sides, so the quiet page's figures are the baseline for the live page's.
    """

    def __init__(self, engine_cores: frozenset[int], perf_cores: frozenset[int], folder: Path):
        self.engine_cores, self.perf_cores, self.folder = engine_cores, perf_cores, folder
        self.rounds: dict[str, list[dict]] = {"no_ui": [], "live": []}
        self._proc = None
        self.browser = BrowserMeter()

    def start(self) -> None:
        self._data = self.folder / f"switches-{time.time_ns()}.data"
        cmd = ["taskset", "-c", cpu_list(self.perf_cores), "perf", "record", "-q", "-k", "CLOCK_MONOTONIC"]
        cmd += ["-e", "sched:sched_switch"]
        cmd += ["-C", cpu_list(self.engine_cores), "-o", str(self._data)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.browser.start()
        time.sleep(0.5)  # perf is recording before Cook is pressed

    def abandon(self) -> None:
        """A round that failed: stop perf if it is still recording, keep no result."""
        self.browser.stop()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            self._proc.wait()

    def stop(self, side: str = "live") -> None:
        self._proc.send_signal(signal.SIGINT)
        self._proc.wait()
        script = ["perf", "script", "-i", str(self._data), "-F", "cpu,time,trace"]
        out = subprocess.run(script, capture_output=True, text=True).stdout
        self._data.unlink(missing_ok=True)
        self.browser.stop()
        held = cook_span_holders(out)
        held["browser_busy_cores"] = self.browser.cores_busy(held.pop("start_s"), held.pop("end_s"))
        self.rounds[side].append(held)

    def medians(self) -> dict:
        keys = ("span_s", "engine_share", "others_ms", "others_runs", "browser_busy_cores")

        def median(xs):
            xs = [x for x in xs if x is not None]
            return round(statistics.median(xs), 4) if xs else None

        return {
            side: {k: median(r.get(k) for r in rows) for k in keys}
            for side, rows in self.rounds.items()
            if rows
        }


SWITCH = re.compile(
    r"\[(\d+)\]\s+([\d.]+):\s+prev_comm=(.*?) prev_pid=(\d+) .*?==> next_comm=(.*?) next_pid=(\d+)"
)


NO_COOK = {"start_s": 0.0, "end_s": 0.0, "span_s": 0.0, "engine_share": 0.0, "others_ms": 0.0, "others_runs": 0,
           "others": {}}  # fmt: skip  # a log in which the engine never cooked


def cook_span_holders(perf_script: str) -> dict:
    """From `perf script -F cpu,time,trace` of sched_switch: the cook's span and who held the core.

    Each switch starts the incoming task's hold of that CPU, which lasts until the CPU's next
    switch. The engine is the Python task with the most time held."""
    last: dict[str, tuple[float, str, str]] = {}  # cpu -> (since, comm, pid) of the task holding it
    holds: list[tuple[float, float, str, str]] = []  # (start, end, comm, pid)
    for m in SWITCH.finditer(perf_script):
        cpu, t, _, _, comm, pid = m.groups()
        t = float(t)
        if cpu in last:
            since, held_comm, held_pid = last[cpu]
            holds.append((since, t, held_comm, held_pid))
        last[cpu] = (t, comm, pid)
    held: dict[str, float] = {}
    for a, b, comm, pid in holds:
        if comm.startswith("python"):
            held[pid] = held.get(pid, 0.0) + b - a
    if not held:
        return dict(NO_COOK)
    engine = max(held, key=held.get)
    # Its idle wake-ups (a message, a poll) are holds of microseconds; cooking holds last until a
    # preemption or a pipe write, so the stretch is built from holds of 0.2 ms and more.
    mine = [(a, b) for a, b, _, pid in holds if pid == engine and b - a >= 2e-4]
    if not mine:
        return dict(NO_COOK)
    best, lo, hi, got = (0.0, 0.0, 0.0), mine[0][0], mine[0][1], mine[0][1] - mine[0][0]
    for a, b in mine[1:] + [(float("inf"), float("inf"))]:
        if a - hi > 0.01:  # a gap: the stretch ends
            if got > best[2]:
                best = (lo, hi, got)
            lo, got = a, 0.0
        hi, got = b, got + (b - a)
    lo, hi, engine_s = best
    others: dict[str, float] = {}
    runs = 0
    for a, b, comm, pid in holds:
        if pid != engine and b > lo and a < hi and pid != "0":
            others[comm] = others.get(comm, 0.0) + min(b, hi) - max(a, lo)
            runs += 1
    top = sorted(others.items(), key=lambda kv: -kv[1])[:6]
    return {
        "start_s": lo,  # on perf's clock (CLOCK_MONOTONIC with -k, as CoreProbe records)
        "end_s": hi,
        "span_s": round(hi - lo, 4),
        "engine_share": round(engine_s / (hi - lo), 4) if hi > lo else 0.0,
        "others_ms": round(sum(others.values()) * 1e3, 2),
        "others_runs": runs,
        "others": {comm: round(v * 1e3, 2) for comm, v in top},
    }


def cpu_list(cores) -> str:
    return ",".join(map(str, sorted(cores)))
