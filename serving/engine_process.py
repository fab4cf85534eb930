"""The engine in its own process: the web server asks, a child process cooks.

Why a child process and not a thread: a torch op needs Python's GIL to be dispatched, and the
Streamlit server process holds that same GIL whenever it reruns a page. A child process has its
own interpreter and GIL, so nothing the page does can stop the soup pot mid-ladle, and the
engine's timings are measured in the child, next to the model (docs/benchmarks/ui-overhead.md).

The pieces: `EngineProcess` (this module) starts the child (serving/child.py), talks to it over
two pipes and guards each job; `EngineProxy` (serving/proxy.py) is the engine-shaped object the
callers hold; `Silence` (serving/watchdog.py) says when a silent child counts as hung; `CoreSplit`
(serving/cores.py) keeps the child's cores apart from the server's.

    proc = EngineProcess("chef", "cpu", "float32", threads=1)
    res = proc.proxy.generate(["ROMEO:"], max_new_tokens=8)
    proc.close()

Three ways a job ends early, each one `EngineError` line:
  - the child dies: this and every later call fail until `restart()`;
  - the child is silent past its limit: it is killed as hung (`serving.watchdog`);
  - the job's `CancelToken` is cancelled (a Cancel button, a closed page, the instructor's time
    limit): the child is told "cancel" and stops at its next event; one that does not answer
    within `CANCEL_GRACE_S` (say, in the middle of a long prefill pass) is killed, so the work
    stops either way. The job raises `Cancelled` with the token's reason.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from serving.child import ENTRY_CODE, PARENT_PATH, Loaded
from serving.cores import CoreSplit, pin_this_process, split_cores
from serving.proxy import EngineProxy
from serving.watchdog import Silence, hung_line

REPO = Path(__file__).resolve().parent.parent
LOAD_TIMEOUT_S = 600  # the longest we wait for the child to load the weights
QUICK = ("limits", "check", "encode", "decode")  # answered beside a running job
CANCEL_GRACE_S = 2.0  # a cancelled job's child must stop within this, or it is killed

__all__ = ["CancelToken", "Cancelled", "ChildFailure", "CoreSplit", "EngineProcess", "Loaded"]


class ChildFailure(RuntimeError):
    """A bug inside the child (not a refused input); `str()` is already "Type: message", one line."""


class Cancelled(EngineError):
    """A job stopped on purpose (cancelled, page closed, past its time); `str()` says why, one line."""


class CancelToken:
    """Ends one job early: `cancel(reason)` from any thread, or a deadline reached while it runs.

    It wakes the thread waiting for the child's next message at once (a socket it can wait on),
    so no one polls.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self.deadline: float | None = None  # time.monotonic() past which the job is cancelled
        self.deadline_reason = ""
        self._r, self._w = socket.socketpair()
        self._lock = threading.Lock()

    def cancel(self, reason: str) -> bool:
        """Ask the job to stop; the first reason wins. True if this call cancelled it."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
        try:
            self._w.send(b"x")
        except OSError:
            pass
        return True

    def set_deadline(self, seconds: float, reason: str) -> None:
        self.deadline, self.deadline_reason = time.monotonic() + seconds, reason

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    def fileno(self) -> int:
        return self._r.fileno()

    def close(self) -> None:
        """Free its socket pair once the job is over (a later `cancel` is then a no-op)."""
        with self._lock:
            if self.reason is None:
                self.reason = "finished"
        self._r.close()
        self._w.close()


class EngineProcess:
    """Starts the child (a fresh Python process) and waits until it has loaded the model.

    Raises `EngineError` (one line) when the model cannot be loaded. Thread-safe: a lock per pipe.
    """

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
        pin_server: bool = False,
        silence: Silence | None = None,
        name: str | None = None,
    ):
        """`model`: what `Engine.load` receives (a folder, `preset:NAME`, an embedded model's name or
        a hub id); `name`: what error lines call it (default: `model`). `threads`: the child's
        torch threads; with cores to spare the child keeps that many cores for itself
        (`split_cores`). `pin_server=True` (the app) also moves this process onto the other
        cores. `silence`: when a running job counts as hung (default: `Silence.from_env()`)."""
        self.model, self.device, self.dtype, self.threads = model, device, dtype, threads
        self.name = name or model
        self.silence = silence or Silence.from_env()
        self.cores: CoreSplit | None = split_cores(threads)
        if pin_server and self.cores is not None:
            pin_this_process(self.cores.server)
        self.loaded: Loaded | None = None
        self.proxy = EngineProxy(self)
        self.cancel_token: CancelToken | None = None  # armed by the worker for the job it runs
        self._job_lock, self._quick_lock = threading.Lock(), threading.Lock()
        self._start()

    def _start(self) -> None:
        """A fresh interpreter (`python -c`), handed one end of two socket pairs.

        Why not `multiprocessing`'s spawn: it re-runs the parent's main script in the child, and
        under Streamlit the main script is app.py (it would draw a page with no session). A plain
        subprocess imports only serving/child.py. Its own session keeps a Ctrl-C in the terminal
        for the server; the child exits when the server's end of the jobs pipe closes.
        """
        jobs, child_jobs = socket.socketpair()
        quick, child_quick = socket.socketpair()
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env[PARENT_PATH] = os.pathsep.join(sys.path)
        fds = (child_jobs.fileno(), child_quick.fileno())
        cores = ",".join(map(str, sorted(self.cores.engine))) if self.cores else "-"
        args = [*map(str, fds), self.model, self.device, self.dtype, str(self.threads or 0), cores]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", ENTRY_CODE, *args], pass_fds=fds, env=env, cwd=REPO, start_new_session=True
        )
        child_jobs.close()  # only the child holds these ends now, so its death reads as EOF here
        child_quick.close()
        self._jobs, self._quick = Connection(jobs.detach()), Connection(quick.detach())
        if not self._jobs.poll(LOAD_TIMEOUT_S):
            self.close()
            raise EngineError(f"loading {self.name} took longer than {LOAD_TIMEOUT_S} s; gave up")
        try:
            _, self.loaded = self._recv(self._jobs)
        except (EngineError, ChildFailure) as err:
            self._wait(5)
            raise EngineError(str(err)) from None

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def restart(self) -> None:
        """Stop the old child (if any is left) and load the model again in a fresh one."""
        self.close()
        self.loaded = None
        self._start()

    def close(self) -> None:
        try:
            self._jobs.send(None)
        except (OSError, ValueError):
            pass
        if not self._wait(10):
            self._proc.terminate()
            self._wait(5)
        for conn in (self._jobs, self._quick):
            conn.close()

    def _wait(self, seconds: float) -> bool:
        """True once the child has exited (within `seconds`)."""
        try:
            self._proc.wait(seconds)
            return True
        except subprocess.TimeoutExpired:
            return False

    # -- talking to the child ----------------------------------------------------------------------

    def ask(self, name: str, args: tuple, kwargs: dict):
        """A quick question on its own pipe: answered even while a job is running; a child that
        does not answer within `silence.quick_s` is stopped as hung (one line, like a hung job)."""
        assert name in QUICK
        with self._quick_lock:
            self._send(self._quick, (name, args, kwargs))
            return self._recv(self._quick, self.silence.quick_s, waiting_for=f"`{name}`")[1]

    def job(self, kind: str, args: tuple, kwargs: dict):
        result = None
        for _, value in self.job_messages((kind, args, kwargs)):
            result = value
        return result

    def job_messages(self, msg: tuple) -> Iterator[tuple[str, Any]]:
        """("event", obj) for each thing the child sends while working, then ("result", value).

        Between two messages the child may be silent at most the job's silence limit; the armed
        `cancel_token` (if any) may end the job at any moment (`Cancelled`)."""
        kind, args, kwargs = msg
        limit_s = self.silence.limit_s(kind, args, kwargs, self.loaded.token_s)
        token = self.cancel_token
        with self._job_lock:
            self._send(self._jobs, msg)
            while True:
                kind, value = self._next_job_message(limit_s, token)
                if kind == "result":
                    break
                yield kind, value
        yield kind, value  # the lock is free again before the caller sees the result

    def job_stream(self, msg: tuple) -> Iterator:
        """The engine's events; closing the iterator early cancels the request in the child.

        Validation errors are raised at the call (like `Engine.stream`), so a refused order fails
        before its first event.
        """
        messages = self.job_messages(msg)
        first = next(messages)  # raises EngineError now if the child refused the request
        return self._events(messages, first)

    def _events(self, messages, first) -> Iterator:
        kind, value = first
        try:
            while kind == "event":
                yield value
                kind, value = next(messages)
        except GeneratorExit:
            self._send(self._jobs, "cancel")
            for _ in messages:  # drain what was already on its way, up to the final result
                pass
            raise

    def _next_job_message(self, limit_s: float, token: CancelToken | None) -> tuple[str, Any]:
        """The child's next message on the jobs pipe, or: hung past `limit_s` (killed), or the
        token cancelled / past its deadline (`Cancelled`, after the child stopped or was killed)."""
        if token is None:
            return self._recv(self._jobs, limit_s)
        silent_until = time.monotonic() + limit_s
        while True:
            now = time.monotonic()
            timeout = silent_until - now
            if token.deadline is not None:
                timeout = min(timeout, token.deadline - now)
            ready = wait([self._jobs, token], max(0.0, timeout)) if not token.cancelled else []
            if self._jobs in ready:
                return self._recv(self._jobs)
            if token.deadline is not None and time.monotonic() >= token.deadline:
                token.cancel(token.deadline_reason)
            if token.cancelled:
                self._stop_job(token.reason or "cancelled")
            if time.monotonic() >= silent_until:
                self._kill_hung(limit_s)

    def _stop_job(self, reason: str) -> None:
        """Tell the child to stop the running job; kill it if it cannot within the grace. Raises
        `Cancelled(reason)` either way, so the caller's job ends now."""
        if self._child_stopped_job():
            raise Cancelled(reason)
        self._proc.kill()  # busy inside one long pass (or gone): stop the work the hard way
        self._wait(5)
        raise Cancelled(reason)

    def _child_stopped_job(self) -> bool:
        """Send "cancel" and read on to the job's last message; True if it came within the grace."""
        try:
            self._jobs.send("cancel")
            end = time.monotonic() + CANCEL_GRACE_S
            while self._jobs.poll(max(0.0, end - time.monotonic())):
                kind, _ = self._jobs.recv()
                if kind != "event":  # the job's last message: the child is free again
                    return True
        except (EOFError, OSError):  # the child is gone
            pass
        return False

    def _recv(self, conn, limit_s: float | None = None, waiting_for: str = "") -> tuple[str, Any]:
        """The child's next message; with `limit_s`, a child silent for longer is killed (hung)."""
        if limit_s is not None and not conn.poll(limit_s):
            self._kill_hung(limit_s, waiting_for)
        try:
            kind, value = conn.recv()
        except (EOFError, OSError) as err:
            self._wait(1)
            code = self._proc.returncode
            raise EngineError(
                f"the engine process for {self.name} stopped (exit code {code}); the kitchen restarts it "
                "for the next order"
            ) from err
        if kind == "engine_error":
            raise EngineError(value)
        if kind == "error":
            raise ChildFailure(value)
        return kind, value

    def _kill_hung(self, limit_s: float, waiting_for: str = "") -> None:
        """Stop a child that is alive but silent, and say so in one line."""
        self._proc.kill()
        self._wait(5)
        raise EngineError(hung_line(self.name, limit_s, waiting_for))

    def _send(self, conn, msg) -> None:
        try:
            conn.send(msg)
        except (OSError, ValueError) as err:
            code = self._proc.poll()
            raise EngineError(
                f"the engine process for {self.name} is not running (exit code {code}); the kitchen "
                "restarts it for the next order"
            ) from err
