"""`Job`: one order or Lab run on the pages' kitchen (serving/host_client.py), as the pages see it.

Only the kitchen writes to a job (status, events, result, error, times); pages read it, and may
`cancel()` it or `watch()` it (cancel it once its page is gone). `events` only ever grows, so a
reader can remember how many it has seen and take the new tail.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from serving.device_lock import LockTicket

log = logging.getLogger(__name__)
USER_CANCEL = "cancelled: you pressed Cancel"
HOLD_S = 5.0  # the longest a held job waits for its page to release it
# What a page may ask for when it releases a held job: wait this long more, so the browser has
# painted the page that pressing Cook produced before the measurement starts (queue time, not
# TTFT or TPOT; measured in docs/benchmarks/ui-overhead.md).
SETTLE_S = 0.5
WATCH_S = 1.0  # how often the kitchen asks whether a watched job's page is still there
ABANDON_S = 3.0  # a page gone this long (not a brief reconnect) has its order cancelled
PAGE_GONE = "cancelled: the page that ordered it was closed or reloaded"

JobStatus = Literal["queued", "loading", "running", "done", "error", "cancelled"]
Work = Any  # what a job carries: a checked order (serving/host/api.py `CheckedOrder`) or a Lab run (lab/registry.py `LabRun`)


class CancelToken:
    """Ends one job early: `cancel(reason)` from any thread; the first reason wins."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._lock = threading.Lock()

    def cancel(self, reason: str) -> bool:
        """True if this call cancelled it (it was neither cancelled nor finished)."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
            return True

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    def close(self) -> None:
        """The job is over: a later `cancel` is a no-op."""
        with self._lock:
            if self.reason is None:
                self.reason = "finished"


@dataclass(eq=False)
class Job:
    """One order or Lab run waiting for, cooking on, or finished by its kitchen."""

    label: str
    work: Work
    status: JobStatus = "queued"
    events: list = field(default_factory=list)
    result: Any = None
    error: str | None = None  # a failed or cancelled job's one line
    settle_s: float = 0.0  # set by release(): how long the kitchen waits after the release
    shared_cores: str | None = None  # why its timings may be slow: something else used the stove
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    finished_at: float | None = None
    order_id: str | None = None  # on a kitchen server: the order's id (its tickets on the class board)
    response: Any = field(default=None, repr=False)  # on a kitchen server: the open stream (Cancel closes it)
    board: dict | None = field(default=None, repr=False)  # on a class kitchen: its board, read while cooking
    cancel_token: CancelToken = field(default_factory=CancelToken, repr=False)
    _service: Any = field(default=None, repr=False)  # the kitchen that runs it (serving/host_client.py)
    _ticket: LockTicket | None = field(default=None, repr=False)  # its place in the stove's line
    _alive: Callable[[], bool] | None = field(default=None, repr=False)
    _gone_since: float | None = field(default=None, repr=False)
    _finished: threading.Event = field(default_factory=threading.Event, repr=False)
    _go: threading.Event = field(default_factory=threading.Event, repr=False)

    @classmethod
    def new(cls, label: str, work: Work, service: Any, hold: bool) -> Job:
        """A job as a kitchen's `submit` makes it: held until `release()` when `hold`."""
        job = cls(label=label, work=work, _service=service)
        if not hold:
            job._go.set()
        return job

    @property
    def finished(self) -> bool:
        return self.status in ("done", "error", "cancelled")

    @property
    def queue_wait_s(self) -> float:
        """Seconds between submit and the engine starting on it (so far, while waiting)."""
        end = self.started_at if self.started_at is not None else time.perf_counter()
        return end - self.submitted_at

    def place_in_line(self) -> int:
        """0 once it cooks (or it is finished); 1 = next in the stove's line; 2 = one job ahead; ..."""
        if self._service is None or self.status in ("running", "done", "error", "cancelled"):
            return 0
        return self._service._place_of(self)

    def waiting_line(self) -> str | None:
        """While the job waits because another kitchen (or a Lab sweep) cooks: the stove's line, naming the
        order that cooks ("Waiting for the stove (cpu): apprentice: cook 1 table(s) ... is cooking")."""
        if self._service is None or self._ticket is None or self.finished:
            return None
        return self._service.device_lock.waiting_line(self._ticket)

    def finish(self, result: Any = None, error: str | None = None, status: JobStatus | None = None) -> None:
        """The kitchen's last word on the job (only the kitchen calls this)."""
        self.result, self.error = result, error
        self.finished_at = time.perf_counter()
        if self.started_at is None:
            self.started_at = self.finished_at
        self.status = status or ("error" if error is not None else "done")
        self.cancel_token.close()
        self._finished.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job is finished; True if it finished within `timeout` seconds."""
        return self._finished.wait(timeout)

    def release(self, settle_s: float = 0.0) -> None:
        """Let a job submitted with `hold=True` start, `settle_s` seconds from now at the earliest
        (see `HostClient.submit` and SETTLE_S)."""
        self.settle_s = settle_s
        self._go.set()

    def cancel(self, reason: str = USER_CANCEL) -> bool:
        """Stop this job: a queued one leaves the queue, a running one stops its engine work.
        True if it was still unfinished. `job.error` becomes `reason`, `job.status` "cancelled"."""
        if self._service is None:
            return False
        return self._service.cancel(self, reason)

    def watch(self, alive: Callable[[], bool]) -> None:
        """Cancel this job once `alive()` has said False for ABANDON_S (its page is gone).

        `alive` is called from the kitchen's watcher thread every WATCH_S: it must be quick and
        thread-safe (the app passes "is this browser session still connected?")."""
        self._alive = alive
        if self._service is not None:
            self._service._start_watcher()


def record_run(run_log, model: str, device: str, job: Job, result: Any) -> None:
    """Every finished generation goes to the server's run log (the dashboard reads it)."""
    if run_log is None or not hasattr(result, "metrics") or not hasattr(result, "trace"):
        return
    try:
        run_log.record(model=model, device=device, result=result, queue_wait_s=job.queue_wait_s)
    except Exception:  # noqa: BLE001 — a broken log must not lose the learner's result
        log.exception("run log refused job %r", job.label)


def cancel_abandoned(jobs: list[Job]) -> None:
    """Cancel each job whose page (`job.watch(alive)`) has said it is gone for ABANDON_S in a row."""
    now = time.monotonic()
    for job in jobs:
        try:
            alive = job._alive()
        except Exception:  # noqa: BLE001 — a probe that fails cannot tell: keep the order
            alive = True
        if alive:
            job._gone_since = None
        elif job._gone_since is None:
            job._gone_since = now
        elif now - job._gone_since >= ABANDON_S:
            log.info("page of job %r is gone; cancelling it", job.label)
            job.cancel(PAGE_GONE)


class PageWatcher:
    """A kitchen's watcher thread, started at its first watched job (`Job.watch`): every WATCH_S it
    cancels the jobs whose page has been gone ABANDON_S (`cancel_abandoned`), until `closed()`."""

    def __init__(self, name: str, jobs: Callable[[], list[Job]], closed: Callable[[], bool]):
        self.name, self._jobs, self._closed = name, jobs, closed
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._closed():
            cancel_abandoned([j for j in self._jobs() if j._alive is not None and not j.finished])
            time.sleep(WATCH_S)
