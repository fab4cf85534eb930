"""How a host starts its loop's process: forked from a server that has torch loaded (Linux), else
spawned fresh; either way under a bare `__main__`, with the parent's environment as it is now.

Why a fork server: a fresh interpreter spends much of a model switch's wait importing torch and the
engine, and every engine restart after a crash pays it again. The fork server (`multiprocessing`'s
forkserver context) imports them once, the first time a loop starts, and forks each loop from
itself: nothing else runs in it, so no thread or lock is copied half-held, which is why it is used
rather than forking the app itself (docs/models.md has the time it saves). macOS and Windows spawn
(fork is unsafe on macOS once system frameworks are loaded; Windows has no fork).

A forked loop starts with the fork server's environment, which is the parent's when the first loop
started; so the entry is given the parent's environment as it is when this loop starts (a test hook
set since, a changed variable) and makes it its own first. What torch read when it loaded in the
fork server (OMP_WAIT_POLICY, engine/__init__.py) stays as it was then: the parent sets it before
the first start. `bare_main` keeps the child from re-running whatever script the parent's `__main__` is.
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

if sys.platform == "linux" and hasattr(os, "fork"):
    CONTEXT = multiprocessing.get_context("forkserver")
    CONTEXT.set_forkserver_preload(["serving.host.loop"])  # torch, the engine and the loop, imported once
else:
    CONTEXT = multiprocessing.get_context("spawn")  # a fresh interpreter
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
    """Start `entry(conn, settings, sweeps, environment)` in a new process; (the process, the parent's end of
    the pipe). `environment` is this process's `os.environ` now."""
    ours, theirs = CONTEXT.Pipe(duplex=True)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the child reads it when torch loads (engine/__init__.py)
    proc = CONTEXT.Process(target=entry, args=(theirs, settings, sweeps, dict(os.environ)), daemon=False,
                           name=f"engine-loop-{settings.model}")  # fmt: skip
    with bare_main():
        proc.start()
    theirs.close()  # only the child holds that end: its death reads as EOF here
    return proc, ours
