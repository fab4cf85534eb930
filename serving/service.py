"""One engine process, one worker thread, one queue: how many browser sessions share one kitchen.

Why a worker thread: an engine runs one job at a time, and Streamlit runs every browser session's
script in its own thread. So exactly one thread (the worker) ever hands the engine a job; pages
only *submit* work and *read* what the worker appended. The worker never calls Streamlit, so a
page that closes mid-run cannot break it, and the next session in line is served as soon as it ends.

The engine itself runs in a child process (serving/engine_process.py): the worker holds an
`EngineProxy`, and a work function `work(engine, emit)` receives it. The worker loads the weights
itself, so the page can say what is happening ("loading weights: 24 MB on cpu") instead of freezing.

Before a job cooks, the worker takes its device's stove (serving/stove.py): jobs of different
kitchens (different models) wait in one line per machine and never cook at the same time.

A job ends early when it is cancelled (`Job.cancel`: a Cancel button), when the page that ordered
it is gone (`Job.watch(alive)`: the kitchen checks every `WATCH_S`, and cancels after
`ABANDON_S` of absence) or when it passes its time limit (`submit(..., time_limit_s=...)`):
a queued job simply leaves the queue, a running one stops its engine work (serving/engine_process.py).

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
from pathlib import Path
from typing import Any, Literal

from engine.errors import EngineError
from engine.loader import EMBEDDED_MODELS
from serving.catalog import resolve_source
from serving.child import warm_up
from serving.cores import ALL_CORES, engine_threads
from serving.engine_process import Cancelled, CancelToken, ChildFailure, EngineProcess
from serving.job import HOLD_S, PAGE_GONE, SETTLE_S, Job, JobStatus, PageWatcher, Work, record_run
from serving.kitchen_client import weights_megabytes
from serving.stove import Stove, StoveMeter, Ticket, stove_for

__all__ = ["HOLD_S", "PAGE_GONE", "SETTLE_S", "Job", "KitchenService", "engine_threads", "warm_up", "weights_megabytes"]

log = logging.getLogger(__name__)
_OPEN: weakref.WeakSet[KitchenService] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Let every worker finish its current step before the interpreter goes away.

    A daemon thread killed in the middle of a torch call aborts the whole process at exit
    ("terminate called without an active exception"), so close them first.
    """
    for svc in list(_OPEN):
        svc.close()


def resolve_model(model: str) -> str:
    """A catalog name -> what `Engine.load` receives (folder, `preset:NAME`, hub id); else as given.

    A model embedded in the repo keeps its name ("chef"): the engine finds assets/models/chef
    itself, and its `info.name` then says "chef", not the folder."""
    try:
        source = resolve_source(model) or model
    except EngineError:  # a broken catalog: the name alone (the engine knows the embedded models)
        return model
    return model if Path(source) == (EMBEDDED_MODELS / model).resolve() else source


class KitchenService:
    """Owns ONE engine for (model, device, dtype) in ONE worker thread; jobs take turns.

    `model` is a catalog name (resolved through serving/catalog.py) or anything `Engine.load`
    takes. `state` is "loading" until the worker has the engine, then "ready", or "error" with
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
        stove: Stove | None = None,
    ):
        self.model, self.device, self.dtype = model, device, dtype
        self.source = resolve_model(model)
        self.threads = threads
        self.pin_server = pin_server  # see EngineProcess: the app keeps its own threads off the engine's cores
        self.run_log = run_log
        self.stove = stove or stove_for(device)
        self.state: Literal["loading", "ready", "error"] = "loading"
        self.load_error: str | None = None
        self.load_s: float | None = None
        self.info = None  # the engine's ModelInfo, once loaded
        self.weights_mb = weights_megabytes(model, dtype, self.source)
        self._engine = None  # the EngineProxy, once the child has loaded the model
        self._process: EngineProcess | None = None
        self._pending: deque[Job] = deque()  # waiting jobs, oldest first (the running one is not here)
        self._current: Job | None = None
        self._cv = threading.Condition()
        self._closed = False
        self._watcher = PageWatcher(f"kitchen-watch-{model}", self._all_jobs, lambda: self._closed)
        self._thread = threading.Thread(target=self._run, name=f"kitchen-{model}-{device}", daemon=True)
        self._thread.start()
        _OPEN.add(self)

    # -- what pages call -------------------------------------------------------------------------

    @property
    def loading_message(self) -> str:
        """What the page shows while the worker reads the weights."""
        size = f"{self.weights_mb:,.1f} MB" if self.weights_mb else "weights"
        return f"loading weights: {size} of {self.model} on {self.device} ({self.dtype})"

    def submit(
        self,
        work: Work,
        label: str,
        hold: bool = False,
        time_limit_s: float | None = None,
        time_limit_line: str = "",
    ) -> Job:
        """Queue `work(engine, emit)` for the worker; returns at once with the job to watch.

        `hold=True`: when its turn comes the worker waits for `job.release()` (at most HOLD_S)
        before starting, plus the settle time the release asks for. The kitchen page releases
        its order after it has finished drawing, so the page's own script run does not compete
        with the engine it measures. `time_limit_s`: the job is cancelled this long after the
        engine started on it, with `time_limit_line` as its error.
        """
        job = Job.new(label, work, self, hold, time_limit_s, time_limit_line)
        with self._cv:
            if self._closed:
                raise EngineError("the kitchen is closed; reload the page to start a new one")
            job.status = "loading" if self.state == "loading" else "queued"
            self._pending.append(job)
            self._cv.notify_all()
        return job

    def cancel(self, job: Job, reason: str) -> bool:
        """See `Job.cancel`."""
        with self._cv:
            if job.finished:
                return False
            if job in self._pending:
                self._pending.remove(job)
                self._finish(job, error=reason, status="cancelled")
                self._cv.notify_all()
                return True
        job.cancel_token.cancel(reason)  # the worker holds it: waiting for the stove, or cooking
        job._go.set()
        self.stove.wake()
        return True

    def queue_length(self) -> int:
        """Orders in the kitchen: the one cooking plus those waiting."""
        with self._cv:
            return len(self._pending) + (self._current is not None)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the engine is loaded (or failed to load); True unless timed out."""
        with self._cv:
            return self._cv.wait_for(lambda: self.state != "loading", timeout)

    @property
    def busy(self) -> bool:
        """True while a job is cooking or waiting (the kitchen is free when False)."""
        return self.queue_length() > 0

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

        A child can go between orders: the OS killed it, a quick question found it hung, or a
        cancelled order's child had to be stopped. The worker would replace it before the next
        order, but the order form asks the engine questions first (limits, token counts) and would
        fail on every rerun. So the page calls this before drawing: the state turns "loading" at
        once (the page says so) and the worker starts a fresh child. True when a restart was started.
        """
        with self._cv:
            if self.state != "ready" or self._process is None or self._process.alive or self._current:
                return False
            self.state = "loading"
        log.warning("engine process for %s is gone between orders; restarting it", self.model)
        self.submit(lambda engine, emit: None, "restart the engine")
        return True

    @property
    def where(self) -> str:
        """Where the engine runs, for the page's caption."""
        return f"in its own process (pid {self.engine_pid})"

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

    def _start_watcher(self) -> None:
        self._watcher.start()

    def _all_jobs(self) -> list[Job]:
        with self._cv:
            return [*self._pending, *([self._current] if self._current else [])]

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
                job.status = "queued"
                self._current = job
            self._cook(job)
            with self._cv:
                self._current = None
                self._cv.notify_all()

    def _load(self) -> None:
        """Start the engine's child process (its load and warm-up happen there) and wait for it.

        Loading takes the stove too: it reads weights and times a warm-up token, on the same cores."""
        ticket = Ticket(f"{self.model}: loading its weights")
        self.stove.take(ticket)
        t0 = time.perf_counter()
        try:
            self._process = EngineProcess(
                self.source, self.device, self.dtype, threads=self.threads, pin_server=self.pin_server,
                name=self.model,
            )  # fmt: skip
            self._engine = self._process.proxy
            self.info = self._engine.info
            state, error = "ready", None
        except EngineError as err:
            state, error = "error", str(err)
        except Exception as err:  # noqa: BLE001 — a bug, but the page still gets one line
            log.exception("loading %s failed", self.model)
            state, error = "error", f"could not load {self.model}: {type(err).__name__}: {err}"
        finally:
            self.stove.give_back(ticket)
        with self._cv:
            self.load_s = time.perf_counter() - t0
            self.state, self.load_error = state, error
            for job in self._pending:
                if job.status == "loading":
                    job.status = "queued"
            self._cv.notify_all()

    def _reload_if_dead(self) -> None:
        """A child that died (killed, out of memory, stopped as hung or cancelled mid-pass) is
        replaced before the next job runs."""
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
        self._reload_if_dead()
        if self._engine is None:
            self._finish(job, error=self.load_error or "the model is not loaded")
            return
        token = job.cancel_token
        job._ticket = Ticket(f"{self.model}: {job.label}")
        if not self.stove.take(job._ticket, cancelled=lambda: token.cancelled):
            self._finish(job, error=token.reason, status="cancelled")
            return
        job.started_at = time.perf_counter()  # the end of its wait in line (this kitchen's and the stove's)
        job.status = "running"
        try:
            time.sleep(job.settle_s)
            self._cook_on_stove(job, token)
        finally:
            self.stove.give_back(job._ticket)
        self._reload_if_dead()  # died, stopped as hung or cancelled mid-pass: a fresh child for the next

    def _cook_on_stove(self, job: Job, token: CancelToken) -> None:
        if token.cancelled:
            self._finish(job, error=token.reason, status="cancelled")
            return
        if job.time_limit_s is not None:
            token.set_deadline(job.time_limit_s, job.time_limit_line)
        process = self._process
        meter = StoveMeter(self._engine_cores(), process.pid) if self.device == "cpu" else None
        process.cancel_token = token
        try:
            result = job.work(self._engine, job.events.append)
        except Cancelled as err:
            self._finish(job, error=str(err), status="cancelled")
            return
        except (EngineError, ChildFailure) as err:
            self._finish(job, error=str(err))
            return
        except Exception as err:  # noqa: BLE001 — a bug: log the traceback, show the page one line
            log.exception("job %r failed", job.label)
            self._finish(job, error=" ".join(f"{type(err).__name__}: {err}".split()))
            return
        finally:
            process.cancel_token = None
            job.shared_stove = meter.verdict() if meter is not None else None
        self._record(job, result)
        self._finish(job, result=result)

    def _engine_cores(self) -> frozenset[int]:
        split = self._process.cores if self._process is not None else None
        return split.engine if split is not None else ALL_CORES

    def _record(self, job: Job, result: Any) -> None:
        record_run(self.run_log, self.model, self.device, job, result)

    @staticmethod
    def _finish(job: Job, result: Any = None, error: str | None = None, status: JobStatus | None = None) -> None:
        job.finish(result, error, status)
