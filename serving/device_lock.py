"""One lock per device (the UI's "stove"): orders for different models never cook at once on one device.

Why: two engines on the same cores (or the same GPU) slow each other down, and each then measures
the other's work as its own, so its panels and its diagnosis describe a kitchen that does not
exist (docs/benchmarks/ui-overhead.md shows how much a neighbour on the engine's core costs). Every
kitchen of this server process takes its device's `DeviceLock` before it cooks and gives it back
after, so jobs for different models wait in ONE line per device, first come first served. Orders
of one host (a ticket's `kitchen`, serving/host_client.py) share the lock: they cook in one batch
of one engine, so they may cook together; a ticket without a kitchen cooks alone.

The lock cannot hold back what runs outside this server (another program, a lab script in its own
process), so `CoreMeter` measures it: the CPU time the engine's cores spent on anything other than
the engine's child and this server, while the job cooked. Past `SHARED_FRACTION` of the job's
wall time the job records why its timings may be slow (`Job.shared_cores`), and the page says so.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

SHARED_FRACTION = 0.10  # other work above this share of the engine cores' time marks the order
SHARED_MIN_S = 0.05  # ... and above this many CPU seconds (a short order's noise is not a neighbour)
_LOCKS: dict[str, DeviceLock] = {}
_LOCKS_LOCK = threading.Lock()


def device_key(device: str) -> str:
    """The physical device an engine cooks on: "cpu", or "cuda:N" ("cuda" is "cuda:0")."""
    return "cuda:0" if device == "cuda" else device


def device_lock_for(device: str) -> DeviceLock:
    """The one stove of this server process for `device` (created on first use)."""
    key = device_key(device)
    with _LOCKS_LOCK:
        if key not in _LOCKS:
            _LOCKS[key] = DeviceLock(key)
        return _LOCKS[key]


@dataclass(eq=False)
class LockTicket:
    """One job's place in the stove's line. `who` names it for the others: "chef: cook 1 table(s) ..."."""

    who: str
    kitchen: str = ""  # tickets of the same (non-empty) kitchen may hold the stove together
    taken_at: float | None = None
    _abandoned: bool = field(default=False, repr=False)


class DeviceLock:
    """A first-come-first-served lock with a visible line."""

    def __init__(self, key: str):
        self.key = key
        self._cv = threading.Condition()
        self._line: deque[LockTicket] = deque()
        self._holders: list[LockTicket] = []

    @property
    def holder(self) -> LockTicket | None:
        """The ticket cooking (the first, when one kitchen's orders cook together), or None."""
        return self._holders[0] if self._holders else None

    def _may_cook(self, ticket: LockTicket) -> bool:
        if self._line[0] is not ticket:
            return False
        return all(ticket.kitchen and h.kitchen == ticket.kitchen for h in self._holders)

    def take(self, ticket: LockTicket, cancelled=lambda: False, poll_s: float = 0.5) -> bool:
        """Wait in line until it is this ticket's turn; False if `cancelled()` turned true first.

        `wake()` (called when a waiting job is cancelled) ends the wait at once; `poll_s` bounds it."""
        with self._cv:
            self._line.append(ticket)
            while not self._may_cook(ticket):
                if cancelled():
                    self._line.remove(ticket)
                    self._cv.notify_all()
                    return False
                self._cv.wait(poll_s)
            self._line.popleft()
            self._holders.append(ticket)
            self._cv.notify_all()  # the next in line may be of the same kitchen
            ticket.taken_at = time.monotonic()
            return True

    def give_back(self, ticket: LockTicket) -> None:
        with self._cv:
            if ticket in self._holders:
                self._holders.remove(ticket)
            self._cv.notify_all()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def place_of(self, ticket: LockTicket) -> int:
        """1 = next to cook once the stove is free; 0 = not waiting (cooking, or not in line)."""
        with self._cv:
            for place, waiting in enumerate(self._line, start=1):
                if waiting is ticket:
                    return place
        return 0

    def waiting_line(self, ticket: LockTicket) -> str | None:
        """What a job waiting for the stove is told, naming who cooks; None when it is not waiting."""
        with self._cv:
            if ticket not in self._line:
                return None
            place = list(self._line).index(ticket) + 1
            cooking = self.holder.who if self.holder is not None else "the order before yours"
        ahead = f"; {place - 1} more ahead of yours" if place > 1 else ""
        return f"Waiting for the stove ({self.key}): {cooking} is cooking{ahead}. One order cooks at a time per machine, so neither slows the other."


# -- what ran beside the engine ---------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _core_busy_s(cores: frozenset[int]) -> float | None:
    """CPU seconds the given cores have spent busy since boot (user+nice+system+irq+softirq+steal)."""
    try:
        total = 0
        with open("/proc/stat") as f:
            for line in f:
                name, *values = line.split()
                if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cores:
                    v = [int(x) for x in values]
                    total += v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
        return total / CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


def _process_cpu_s(pid: int | str) -> float | None:
    """CPU seconds (user + system) a process has used, all its threads included."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


class CoreMeter:
    """Measures, over one job, how much of the engine's cores went to something else.

    other = busy time of the engine's cores - the child's CPU time - this server's CPU time.
    Example: 2 s on one engine core, child 1.5 s, server 0.1 s -> other 0.4 s = 20 % > 10 %: shared.
    """

    def __init__(self, cores: frozenset[int], child_pid: int | None):
        self.cores, self.child_pid = cores, child_pid
        self.t0 = time.monotonic()
        self.start = self._sample()

    def _sample(self) -> tuple | None:
        busy = _core_busy_s(self.cores)
        child = _process_cpu_s(self.child_pid) if self.child_pid else None
        own = _process_cpu_s("self")
        return None if None in (busy, child, own) else (busy, child, own)

    def verdict(self) -> str | None:
        """A line naming what else used the stove, or None when it looked free (or cannot be told)."""
        end = self._sample()
        if self.start is None or end is None or not self.cores:
            return None
        wall = time.monotonic() - self.t0
        busy, child, own = (e - s for e, s in zip(end, self.start, strict=True))
        other = busy - child - own
        if other <= max(SHARED_MIN_S, SHARED_FRACTION * wall * len(self.cores)):
            return None
        share = other / max(wall * len(self.cores), 1e-9)
        return (
            f"something else used the engine's cores for {other:.1f} s of this order's {wall:.1f} s "
            f"({share:.0%}: another program, or a lab run in another process), so these timings may be "
            "slower than this machine can do"
        )
