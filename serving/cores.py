"""Which cores the engine's child keeps, and how many torch threads it runs.

The rule: the engine being measured gets cores of its own, and everything that watches it (the
web server, its page reruns, the browser) gets the others. A separate process removes the shared
GIL but not the shared cores, and a torch parallel region waits for its slowest thread, so a
thread preempted by the page stalls the whole step. Measurements: docs/benchmarks/ui-overhead.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from serving.app_settings import AppSettings

# The cores this process may use: Linux's affinity, else psutil's (Windows); none where the OS has no
# affinity API (macOS), and then the cores are never split.
ALL_CORES = frozenset(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else
                      psutil.Process().cpu_affinity() if hasattr(psutil.Process, "cpu_affinity") else ())  # fmt: skip


def engine_threads() -> int:
    """Threads the app's engine uses: every core but one, which is left to the page watching it.

    Example: 2 cores -> 1 thread, 8 cores -> 7. The app's settings' `threads` (`--threads`) overrides it.
    """
    return AppSettings.current().threads or max(1, (os.cpu_count() or 2) - 1)


@dataclass(frozen=True)
class CoreSplit:
    engine: frozenset[int]  # the cores the engine's child keeps for its torch threads
    server: frozenset[int]  # the rest: the web server (and, if it is pinned, its pages' reruns)


def split_cores(threads: int | None) -> CoreSplit | None:
    """Give the engine its own `threads` cores (the last ones) and the server the others.

    Example: cores {0, 1}, threads 1 -> engine {1}, server {0}. None when no core is left over
    (threads unset, or at least as many threads as cores), where the OS has no affinity API, or
    when the app's settings turn the split off (`--no-pin`).
    """
    cores = sorted(ALL_CORES)
    if not threads or threads >= len(cores) or not AppSettings.current().pin:
        return None
    return CoreSplit(frozenset(cores[-threads:]), frozenset(cores[:-threads]))


def pin_this_process(cores: frozenset[int]) -> None:
    """Every thread of this process onto `cores` (threads started later inherit their creator's);
    where threads cannot be pinned one by one (Windows), the whole process at once."""
    if not hasattr(os, "sched_setaffinity"):
        psutil.Process().cpu_affinity(sorted(cores))
        return
    for thread in psutil.Process().threads():
        try:
            os.sched_setaffinity(thread.id, cores)
        except OSError:  # a thread that ended meanwhile
            pass
