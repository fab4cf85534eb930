"""One engine process, one worker thread, one queue: how many browser sessions share one kitchen.

Why a worker thread: an `Engine` is not thread-safe, and Streamlit runs every browser session's
script in its own thread. So exactly one thread (the worker) ever hands the engine a job; pages
only *submit* work and *read* what the worker appended. The worker never calls Streamlit, so a
page that closes mid-run cannot break it, and the next session in line is served as soon as it ends.

Why the engine itself lives in a child process (`kitchen_viz.engine_process`): the instrument
must not disturb the measurement. In a thread of the Streamlit server, the engine shared the GIL
with every page rerun, and each live refresh stalled a decode step (docs/benchmarks/ui-overhead.md).
The worker thread holds an `EngineProxy` instead: same methods, answered by the child. A work
function `work(engine, emit)` receives that proxy; code that needs the real engine in-process
(model internals, the profiler, process CPU time) goes through `engine.run(top_level_fn, ...)`.

Why the worker loads the weights itself: loading takes seconds on a cold machine, and the page
should say what is happening ("loading weights: 24 MB on cpu") instead of freezing.

Worked example (what a page or the lab does):

    svc = KitchenService("chef", "cpu", "float32")
    job = svc.submit(lambda eng, emit: eng.generate(["ROMEO:"], max_new_tokens=8), "cook")
    job.wait(60)
    job.status   # "done"; job.result is the GenerationResult, job.error a line when it failed

`work(engine, emit)` may call `emit(obj)` as often as it likes: each object is appended to
`job.events` (engine events for the kitchen's animation, progress records for the lab).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.errors import EngineError
from kitchen_viz.engine_process import ChildFailure, EngineProcess, warm_up

__all__ = ["HOLD_S", "Job", "KitchenService", "engine_threads", "warm_up", "weights_megabytes"]

log = logging.getLogger(__name__)
HOLD_S = 5.0  # the longest a held job waits for its page to release it
# What a page may ask for when it releases a held job: wait this long more, so the browser has
# painted the page that pressing Cook produced before the measurement starts (queue time, not TTFT
# or TPOT). Measured with the quiet view on a busy 2-core machine (docs/benchmarks/ui-overhead.md):
# TPOT +14 % and +20 % over no UI without it, -4 %, -2 % and -3 % with 0.5 s. Both views use it:
# the live view once measured worse with it, but that was Streamlit's full garbage collection
# after each rerun, which the kitchen page now keeps out of the cook (kitchen_ui.py).
SETTLE_S = 0.5
_OPEN: weakref.WeakSet[KitchenService] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Let every worker finish its current step before the interpreter goes away.

    A daemon thread killed in the middle of a torch call aborts the whole process at exit
    ("terminate called without an active exception"), so close them first.
    """
    for svc in list(_OPEN):
        svc.close()


JobStatus = Literal["queued", "loading", "running", "done", "error"]
Work = Callable[[Any, Callable[[Any], None]], Any]


@dataclass(eq=False)
class Job:
    """One unit of work waiting for, running on, or finished by the worker.

    Only the worker writes to a job (status, events, result, error, times); pages read. `events`
    only ever grows, so a reader can remember how many it has seen and take the new tail.
    """

    label: str
    work: Work
    status: JobStatus = "queued"
    events: list = field(default_factory=list)
    result: Any = None
    error: str | None = None
    settle_s: float = 0.0  # set by release(): how long the worker waits after the release
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    finished_at: float | None = None
    _service: KitchenService | None = field(default=None, repr=False)
    _finished: threading.Event = field(default_factory=threading.Event, repr=False)
    _go: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in ("done", "error")

    @property
    def queue_wait_s(self) -> float:
        """Seconds between submit and the worker picking the job up (so far, while waiting)."""
        end = self.started_at if self.started_at is not None else time.perf_counter()
        return end - self.submitted_at

    def place_in_line(self) -> int:
        """0 once the worker has it (or it is finished); 1 = next up; 2 = one job ahead; ..."""
        if self._service is None or self.status in ("running", "done", "error"):
            return 0
        return self._service._place_of(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job is finished; True if it finished within `timeout` seconds."""
        return self._finished.wait(timeout)

    def release(self, settle_s: float = 0.0) -> None:
        """Let a job submitted with `hold=True` start, `settle_s` seconds from now at the earliest
        (see `KitchenService.submit` and SETTLE_S)."""
        self.settle_s = settle_s
        self._go.set()


def engine_threads() -> int:
    """Threads the app's engine uses: every core but one, which is left to the page watching it.

    Why: the instrument must not disturb the measurement. The browser animating the kitchen and
    the server feeding it need a core; if torch's threads also want every core, a parallel region
    waits for a thread the page has preempted: measured on this 2-core machine with one core kept
    busy, the chef's decode step took 119 ms with 2 threads and 9 ms with 1 (2.1-3.7 ms when quiet
    either way; docs/benchmarks/ui-overhead.md). TWO_POT_THREADS overrides it.
    """
    import os

    if os.environ.get("TWO_POT_THREADS"):
        return max(1, int(os.environ["TWO_POT_THREADS"]))
    return max(1, (os.cpu_count() or 2) - 1)


def weights_megabytes(model: str, dtype: str) -> float | None:
    """How many MB of weights loading `model` reads, known before loading (None if unknown).

    Asks the catalog first (it computes bytes per dtype from the config alone); for a plain
    folder it sums the safetensors files.
    """
    try:
        from engine.catalog import describe, load_catalog

        entry = load_catalog().get(model)
        return describe(entry).weight_bytes[dtype] / 1e6
    except Exception:  # noqa: BLE001 — an unknown name or a missing catalog just means "unknown size"
        pass
    folder = Path(model)
    if folder.is_dir():
        return sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 1e6 or None
    return None


class KitchenService:
    """Owns ONE engine for (model, device, dtype) in ONE worker thread; jobs take turns.

    `state` is "loading" until the worker has the engine, then "ready", or "error" with
    `load_error` (one line) when the model cannot be loaded; jobs submitted then fail with it.
    """

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        dtype: str = "float32",
        run_log=None,
        threads: int | None = None,
        pin_server: bool = False,
    ):
        self.model, self.device, self.dtype = model, device, dtype
        self.threads = threads
        self.pin_server = (
            pin_server  # see EngineProcess: the app keeps its own threads off the engine's cores
        )
        self.run_log = run_log
        self.state: Literal["loading", "ready", "error"] = "loading"
        self.load_error: str | None = None
        self.load_s: float | None = None
        self.info = None  # the engine's ModelInfo, once loaded
        self.weights_mb = weights_megabytes(model, dtype)
        self._engine = None  # the EngineProxy, once the child has loaded the model
        self._process: EngineProcess | None = None
        self._pending: deque[Job] = deque()  # waiting jobs, oldest first (the running one is not here)
        self._current: Job | None = None
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"kitchen-{model}-{device}", daemon=True)
        self._thread.start()
        _OPEN.add(self)

    # -- what pages call -------------------------------------------------------------------------

    @property
    def loading_message(self) -> str:
        """What the page shows while the worker reads the weights."""
        size = f"{self.weights_mb:,.1f} MB" if self.weights_mb else "weights"
        return f"loading weights: {size} of {self.model} on {self.device} ({self.dtype})"

    def submit(self, work: Work, label: str, hold: bool = False) -> Job:
        """Queue `work(engine, emit)` for the worker; returns at once with the job to watch.

        `hold=True`: when its turn comes the worker waits for `job.release()` (at most HOLD_S)
        before starting, plus the settle time the release asks for. The kitchen page releases
        its order after it has finished drawing, so the page's own script run (and, with a settle
        time, the browser painting its result) does not compete with the engine it measures.
        """
        job = Job(label=label, work=work, _service=self)
        if not hold:
            job._go.set()
        with self._cv:
            if self._closed:
                raise EngineError("the kitchen is closed; reload the page to start a new one")
            job.status = "loading" if self.state == "loading" else "queued"
            self._pending.append(job)
            self._cv.notify_all()
        return job

    def queue_length(self) -> int:
        """Orders in the kitchen: the one cooking plus those waiting."""
        with self._cv:
            return len(self._pending) + (self._current is not None)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the engine is loaded (or failed to load); True unless timed out."""
        with self._cv:
            return self._cv.wait_for(lambda: self.state != "loading", timeout)

    # -- quick, read-only questions (answered on the caller's thread) -----------------------------

    def limits(self, prompt_len: int, max_new_tokens: int):
        """`Engine.limits`: pure arithmetic on the config and free memory, safe beside a running job."""
        return self._loaded().limits(prompt_len, max_new_tokens)

    def check(self, prompts: list, max_new_tokens: int, **settings) -> list[list[int]]:
        """`Engine.check`: validation plus tokenization, no tensors; raises EngineError with the reason."""
        return self._loaded().check(prompts, max_new_tokens, **settings)

    def encode(self, text: str) -> list[int]:
        """`Engine.encode`: the tokenizer alone (thread-safe), for counting a prompt's tokens."""
        return self._loaded().encode(text)

    def _loaded(self):
        if self._engine is None:
            raise EngineError(self.load_error or f"{self.model} is still loading")
        if self.revive_if_dead():
            raise EngineError(f"the engine process for {self.model} had stopped; it is loading again")
        return self._engine

    def revive_if_dead(self) -> bool:
        """Replace a child that died or was stopped while no order was cooking, now.

        A child can go between orders: the OS killed it, or a quick question found it hung and
        stopped it. The worker would replace it before the next order, but the order form asks the
        engine questions first (limits, token counts) and would fail on every rerun. So the page
        calls this before drawing: the state turns "loading" at once (the page says so) and the
        worker starts a fresh child. True when a restart was started.
        """
        with self._cv:
            if self.state != "ready" or self._process is None or self._process.alive:
                return False
            self.state = "loading"
        log.warning("engine process for %s is gone between orders; restarting it", self.model)
        self.submit(lambda engine, emit: None, "restart the engine")
        return True

    @property
    def engine_pid(self) -> int | None:
        """The child process that runs the engine (None until loaded)."""
        return self._process.pid if self._process is not None else None

    def close(self) -> None:
        """Stop the worker after the job it is running; queued jobs fail with a clear line."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        if self._process is not None:
            self._process.close()

    def _place_of(self, job: Job) -> int:
        with self._cv:
            for place, queued in enumerate(self._pending, start=1):
                if queued is job:
                    return place
        return 0

    # -- the worker ------------------------------------------------------------------------------

    def _run(self) -> None:
        self._load()
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    for job in self._pending:
                        self._finish(job, error="the kitchen closed before this order was cooked")
                    self._pending.clear()
                    return
                job = self._pending.popleft()
                job.started_at = time.perf_counter()
                job.status = "running"
                self._current = job
            self._cook(job)
            with self._cv:
                self._current = None
                self._cv.notify_all()

    def _load(self) -> None:
        """Start the engine's child process (its load and warm-up happen there) and wait for it."""
        t0 = time.perf_counter()
        try:
            self._process = EngineProcess(
                self.model, self.device, self.dtype, threads=self.threads, pin_server=self.pin_server
            )
            self._engine = self._process.proxy
            self.info = self._engine.info
            state, error = "ready", None
        except EngineError as err:
            state, error = "error", str(err)
        except Exception as err:  # noqa: BLE001 — a bug, but the page still gets one line
            log.exception("loading %s failed", self.model)
            state, error = "error", f"could not load {self.model}: {type(err).__name__}: {err}"
        with self._cv:
            self.load_s = time.perf_counter() - t0
            self.state, self.load_error = state, error
            for job in self._pending:
                if job.status == "loading":
                    job.status = "queued"
            self._cv.notify_all()

    def _reload_if_dead(self) -> None:
        """A child that died (killed, out of memory) is replaced before the next job runs."""
        if self._process is None or self._process.alive:
            return
        log.warning("engine process for %s died; restarting it", self.model)
        with self._cv:
            self.state = "loading"
        self._process.close()
        self._engine = None
        self._load()

    def _cook(self, job: Job) -> None:
        job._go.wait(HOLD_S)
        time.sleep(job.settle_s)
        self._reload_if_dead()
        if self._engine is None:
            self._finish(job, error=self.load_error or "the model is not loaded")
            return
        try:
            result = job.work(self._engine, job.events.append)
        except (EngineError, ChildFailure) as err:
            self._finish(job, error=str(err))
            self._reload_if_dead()  # died or stopped as hung: a fresh child before the next order
            return
        except Exception as err:  # noqa: BLE001 — a bug: log the traceback, show the page one line
            log.exception("job %r failed", job.label)
            self._finish(job, error=" ".join(f"{type(err).__name__}: {err}".split()))
            return
        self._record(job, result)
        self._finish(job, result=result)

    def _record(self, job: Job, result: Any) -> None:
        """Every finished generation goes to the server's run log (the dashboard reads it)."""
        if self.run_log is None or not hasattr(result, "metrics") or not hasattr(result, "trace"):
            return
        try:
            self.run_log.record(
                model=self.model, device=self.device, result=result, queue_wait_s=job.queue_wait_s
            )
        except Exception:  # noqa: BLE001 — a broken log must not lose the learner's result
            log.exception("run log refused job %r", job.label)

    @staticmethod
    def _finish(job: Job, result: Any = None, error: str | None = None) -> None:
        job.result, job.error = result, error
        job.finished_at = time.perf_counter()
        if job.started_at is None:
            job.started_at = job.finished_at
        job.status = "error" if error is not None else "done"
        job._finished.set()
