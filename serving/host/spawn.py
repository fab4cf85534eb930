"""How a host starts its loop's process: `multiprocessing`'s spawn context, under a bare `__main__`.

Spawn gives a fresh interpreter on every OS (no fork, no inherited file descriptors); `bare_main`
keeps the child from re-running whatever script the parent's `__main__` is.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.util  # noqa: F401 -- before the atexit hook below: exit hooks run last first
import os
import sys
import threading
import types
import weakref

SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter, on every OS (no fork, no inherited fds)
_BARE_MAIN = types.ModuleType("__main__")  # no file, no spec: what the child is told the parent's script is
_START_LOCK = threading.Lock()
RUNNING: weakref.WeakSet = weakref.WeakSet()  # hosts' engine processes not yet closed (serving/host/process.py)


@atexit.register
def _close_all() -> None:
    """At exit, stop every loop still running, before multiprocessing waits for its children."""
    for process in list(RUNNING):
        process.close()


@contextlib.contextmanager
def bare_main():
    """While a loop starts, the parent's `__main__` is a module without a file. A spawned child runs
    the parent's main script again to rebuild it; here that would be Streamlit's page (Streamlit
    installs each page as `__main__` while it runs), a benchmark script, or stdin. The loop needs none
    of it: its entry and arguments live in this package."""
    with _START_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = _BARE_MAIN
        try:
            yield
        finally:
            if sys.modules.get("__main__") is _BARE_MAIN:
                sys.modules["__main__"] = main


def start_loop(entry, settings, sweeps):
    """Start `entry(conn, settings, sweeps)` in a fresh process; (the process, the parent's end of the pipe)."""
    ours, theirs = SPAWN.Pipe(duplex=True)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the child reads it when torch loads (engine/__init__.py)
    proc = SPAWN.Process(target=entry, args=(theirs, settings, sweeps), daemon=False, name=f"engine-loop-{settings.model}")
    with bare_main():
        proc.start()
    theirs.close()  # only the child holds that end: its death reads as EOF here
    return proc, ours
