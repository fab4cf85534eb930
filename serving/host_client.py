"""The pages' client of a host: its orders and sweeps as jobs, on the machine's one stove.

`two-pot-kitchen` opens its hosts inside the app's own process (serving/http/mounted.py) and the
Kitchen calls them directly (serving/host/host.py `EngineHost`); with `--backend URL` it orders
from a `two-pot-kitchen serve` across the room over HTTP (serving/clients/remote.py `RemoteHost`).
One client, one code path for both, and no HTTP request from the app to itself. Every browser
session's order joins the same continuous batch as the class's requests, so a learner who presses
Cook while the class is cooking sees the rush inside their own order.

`HostClient` is the one kitchen the pages use (state, info, limits, check, submit, cancel, the
place in line), whatever the launch:

    svc = HostClient("http://GPU-BOX:8000", model="chef")   # a URL, or any serving.host.api.Host
    svc.wait_ready(60)
    order = svc.check(OrderForm(["ROMEO:"] * 2, 32))       # the one question to the engine: token ids
    job = svc.submit(order, "cook 2 tables")               # the checked order cooks, as it was checked
    job.wait(60); job.result                               # the GenerationResult the host's engine built

Orders of one kitchen are not served one after another: the host's scheduler seats them in one
batch. Only another kitchen's order or a Lab sweep on the same machine makes one wait (the stove,
serving/device_lock.py), and the host restarts an engine that died or went silent (serving/host/process.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import httpx

from engine.errors import EngineError
from engine.events import Done
from engine.limits import Limits
from engine.loader import ModelInfo
from serving.catalog import describe, load_catalog
from serving.clients.remote import NOT_TWO_POT, RemoteHost
from serving.cores import ALL_CORES, split_cores
from serving.device_lock import CoreMeter, LockTicket, device_lock_for
from serving.host.api import CheckedOrder, Host, NotReady, OrderForm, StreamClosed, StreamFailed
from serving.host.wire import to_json
from serving.job import HOLD_S, Job, PageWatcher, record_run

CONNECT_TIMEOUT_S = 600.0  # the longest we wait for the server to load the model
POLL_S = 0.25
BOARD_S = 0.5  # how often the live rail is refreshed while an order cooks
NO_STEPS = 2**62  # `since` past every step: a board with its tickets and no steps
PENDING_BOARD = {"tickets": [], "pending": True}  # an order's board before its first read
CHECKS_KEPT = 32  # answers to the order form's checks kept: its page asks the same again at every rerun


def weights_megabytes(model: str, dtype: str, source: str | None = None) -> float | None:
    """How many MB of weights loading `model` reads, known before loading (None if unknown).

    Asks the catalog first (it computes bytes per dtype from the config alone); for a plain
    folder it sums the safetensors files.
    """
    try:
        entry = load_catalog().get(model)
        return describe(entry).weight_bytes[dtype] / 1e6
    except Exception:  # noqa: BLE001 — an unknown name or a missing catalog just means "unknown size"
        pass
    folder = Path(source or model)
    if folder.is_dir():
        return sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 1e6 or None
    return None


class HostClient:
    """One model's kitchen on a host: a `serving.host.api.Host`, the URL of one, or a function that
    finds one (called until it stops raising `NotReady`: the app opens its hosts on first use)."""

    def __init__(self, host: Host | str | Callable[[], Host], model: str, device: str = "cpu", dtype: str = "float32",
                 api_key: str | None = None, run_log=None):  # fmt: skip
        self._owns_host = isinstance(host, str)  # a host of its own (a URL's): closed with this kitchen
        host = RemoteHost(host, api_key) if isinstance(host, str) else host
        self.host: Host | None = host if hasattr(host, "about") else None
        self._find = host if self.host is None else None
        self.model, self.device, self.dtype = model, device, dtype
        self.run_log = run_log
        self._state, self.load_error = "loading", None
        self.info = None  # engine.loader.ModelInfo, once the host has the model loaded
        self.threads: int | None = None
        self.engine_pid: int | None = None
        self.about: dict = {}
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
        self.foreign = False  # True: the server answers but is not a Two-Pot kitchen server (vLLM, llama.cpp)
        self._checks: OrderedDict[bytes, CheckedOrder] = OrderedDict()
        self._closed = False
        self.weights_mb = weights_megabytes(model, dtype)
        self.device_lock = device_lock_for(device)  # one stove per machine: another model's kitchen waits (serving/device_lock.py)
        self._watcher = PageWatcher(f"kitchen-watch-{model}", self._unfinished, lambda: self._closed)
        threading.Thread(target=self._connect, daemon=True, name=f"kitchen-client-{model}").start()

    # -- the host ------------------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """"loading", "ready" or "error". A host this client found (the app's own) that has since been
        closed (its room given to another kitchen) is found again: loading, until it is ready."""
        if self._state == "ready" and self._find is not None and getattr(self.host, "closed", False):
            with self._lock:
                if self._state == "ready":
                    self._state, self.host = "loading", None
                    self._ready.clear()
                    threading.Thread(target=self._connect, daemon=True, name=f"kitchen-client-{self.model}").start()
        return self._state

    def _connect(self) -> None:
        """Ask the host about its model until it has it loaded (`NotReady` while it loads)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        last = "no answer yet"
        while not self._closed and time.monotonic() < deadline:
            try:
                if self.host is None:
                    self.host = self._find()
                about = self.host.about()
                if about.get("name") != self.model:
                    last = (f"it serves '{about.get('name')}' only: choose that model in the sidebar "
                            "(a kitchen server cooks one model)")  # fmt: skip
                    break
                self.about = about
                self.info = ModelInfo(**about["info"])
                self.threads, self.engine_pid = about.get("threads"), about.get("pid")
                self._state = "ready"
                self._ready.set()
                return
            except NotReady as err:  # still loading: ask again
                last = str(err)
            except EngineError as err:  # anything else will not get better
                last = str(err)
                self.foreign = last == NOT_TWO_POT  # another make of OpenAI server: the page says so, not as an error
                break
            except (ValueError, KeyError, TypeError) as err:
                last = f"{type(err).__name__}: {err}"
            time.sleep(POLL_S)
        self._state, self.load_error = "error", f"{self.label} did not serve {self.model}: {last}"
        self._ready.set()

    @property
    def label(self) -> str:
        return self.host.label if self.host is not None else "this server's own kitchen"

    @property
    def where(self) -> str:
        """Where the engine runs, for the page's caption."""
        return f"on {self.host.label} (engine pid {self.engine_pid})"

    def board(self, order_id: str, since: int | None = None) -> dict | None:
        """The class board with this order's tickets marked (serving/http/board.py), its steps after
        `since` (None: every step it keeps); None if unreadable."""
        return self.host.board(order_id, since=-1 if since is None else since) if self.host is not None else None

    @property
    def loading_message(self) -> str:
        if isinstance(self.host, RemoteHost):
            return f"the kitchen server is loading {self.model} on {self.device} ({self.dtype})"
        size = f"{self.weights_mb:,.1f} MB" if self.weights_mb else "weights"
        return f"loading weights: {size} of {self.model} on {self.device} ({self.dtype})"

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    # -- the order form's questions --------------------------------------------------------------------------
    def limits(self, prompt_len: int, max_new_tokens: int) -> Limits:
        """What one order of this shape may ask (arithmetic on the kitchen's shape, in the host)."""
        return self._ready_host().limits(prompt_len, max_new_tokens)

    def check(self, form: OrderForm) -> CheckedOrder:
        """The host's check of an order: its token ids, the engine's limits and the caps met; a
        refusal is `EngineError` (one line). The same question is answered once: the order form
        asks it again at every rerun of its page, and the answer of a loaded kitchen does not change."""
        key = encode_form(form)
        with self._lock:
            if key in self._checks:
                self._checks.move_to_end(key)
                return self._checks[key]
        order = self._ready_host().check(form)
        with self._lock:
            self._checks[key] = order
            while len(self._checks) > CHECKS_KEPT:
                self._checks.popitem(last=False)
        return order

    def _ready_host(self) -> Host:
        if self.state != "ready":
            raise EngineError(self.load_error or f"{self.model} is still loading on the kitchen server")
        return self.host

    # -- orders ------------------------------------------------------------------------------------------------
    def submit(self, work: CheckedOrder, label: str, hold: bool = False) -> Job:
        """Cook a checked order (`check`), or run a Lab run (lab/registry.py `LabRun`); returns its job at
        once. `hold`: the job waits for its page's `job.release(settle_s)` (at most HOLD_S) before it
        cooks. The instructor's time cap is the host's: past it the order's stream ends in one line."""
        order = work if isinstance(work, CheckedOrder) else None
        if order is None and not hasattr(work, "settings"):
            raise EngineError("a kitchen cooks checked orders (`check`) and the Lab's runs (lab/registry.py "
                              "`LabRun`), not other code")  # fmt: skip
        job = Job.new(label, work, self, hold)
        if order is not None:
            job.board = dict(PENDING_BOARD)  # the live rail keeps its place until the first read
        with self._lock:
            if self._closed:
                raise EngineError("the kitchen is closed; reload the page to start a new one")
            self._jobs.append(job)
        if order is not None:
            threading.Thread(target=self._cook, args=(job, order), daemon=True, name=f"order-{label}").start()
        else:
            threading.Thread(target=self._lab, args=(job, work), daemon=True, name=f"lab-{label}").start()
        return job

    def cancel(self, job: Job, reason: str) -> bool:
        if job.finished or not job.cancel_token.cancel(reason):
            return False
        job._go.set()
        self.device_lock.wake()  # a job waiting in the stove's line leaves it at once
        if job.response is not None:
            job.response.close()  # the reading thread wakes at once; the host cancels at its next step
        return True

    def queue_length(self) -> int:
        with self._lock:
            return sum(not j.finished for j in self._jobs)

    def _place_of(self, job: Job) -> int:
        """Its place in the machine's stove line (serving/device_lock.py), while another kitchen or a Lab
        sweep cooks; 0 otherwise: this kitchen's orders cook together, seated by the host's scheduler."""
        return self.device_lock.place_of(job._ticket) if job._ticket is not None else 0

    def close(self) -> None:
        """Cancel this kitchen's orders and let go of its host (the host's own kitchen keeps cooking)."""
        self._closed = True
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            self.cancel(job, "the kitchen closed before this order was cooked")
        if self._owns_host and self.host is not None:
            self.host.close()

    # -- one order, on its own thread -----------------------------------------------------------------------------
    def _cook(self, job: Job, order) -> None:
        job._go.wait(HOLD_S)
        token = job.cancel_token
        ticket = LockTicket(f"{self.model}: {job.label}", kitchen=f"{self.host.label} {self.model}")
        self._on_device(job, ticket, token, lambda: self._cook_holding(job, order, token))

    def _on_device(self, job: Job, ticket: LockTicket, token, work) -> None:
        """Run `work()` holding the machine's stove (serving/device_lock.py); a cancel while the job waits
        in the stove's line ends it there."""
        job._ticket = ticket
        if token.cancelled or not self.device_lock.take(ticket, cancelled=lambda: token.cancelled):
            return self._finish(job, error=token.reason, status="cancelled")
        try:
            work()
        finally:
            self.device_lock.give_back(ticket)

    def _cook_holding(self, job: Job, order: CheckedOrder, token) -> None:
        if not token.cancelled:
            self._ready.wait(CONNECT_TIMEOUT_S)
            job.started_at, job.status = time.perf_counter(), "running"  # the end of its wait
            time.sleep(job.settle_s)
        if token.cancelled:
            return self._finish(job, error=token.reason, status="cancelled")
        if self.state != "ready":
            return self._finish(job, error=self.load_error or "the model is not loaded")
        try:
            meter = self._meter()
            result = self._stream(job, order)
            job.shared_cores = meter.verdict() if meter is not None else None
        except (httpx.HTTPError, RuntimeError) as err:  # a closed stream (Cancel) reads as one of these
            if token.cancelled or isinstance(err, StreamClosed):
                return self._finish(job, error=token.reason, status="cancelled")
            return self._finish(job, error=f"{self.host.label} stopped answering: {type(err).__name__}: {err}")
        except ValueError as err:  # an EngineError (the host's line), or a stream the Kitchen cannot read
            if token.cancelled:
                return self._finish(job, error=token.reason, status="cancelled")
            line = str(err) if isinstance(err, EngineError) else f"{self.host.label} sent what the Kitchen " \
                f"cannot read: {err}"  # fmt: skip
            timed_out = isinstance(err, StreamFailed) and err.kind == "timeout_error"  # the instructor's time cap
            return self._finish(job, error=" ".join(line.split()), status="cancelled" if timed_out else None)
        except Exception as err:  # noqa: BLE001 -- a bug must still end the job, in one line
            return self._finish(job, error=" ".join(f"the Kitchen could not follow this order: {type(err).__name__}: "
                                                    f"{err}".split()))  # fmt: skip
        record_run(self.run_log, self.model, self.device, job, result)
        self._finish(job, result=result)

    def _meter(self) -> CoreMeter | None:
        """What else used the engine's cores while an order cooks: measurable when the engine runs
        on this machine's CPU (a host in this process), on the cores its loop was pinned to."""
        if isinstance(self.host, RemoteHost) or self.device != "cpu":
            return None
        try:  # the engine's process now: the host replaces one that died or hung
            self.engine_pid = self.host.about().get("pid") or self.engine_pid
        except EngineError:
            return None
        if not self.engine_pid:
            return None
        split = split_cores(self.threads)
        return CoreMeter(split.engine if split is not None else ALL_CORES, self.engine_pid)

    def _stream(self, job: Job, order: CheckedOrder):
        """Send the order and fold its events into `job.events`; returns the GenerationResult."""
        result = None
        job.response = stream = self.host.order(order)
        for msg in stream:
            if "order" in msg:
                job.order_id = msg["order"]  # names its tickets on the class board
                threading.Thread(target=self._follow_board, args=(job,), daemon=True).start()
                continue
            for ev in msg.get("events", ()):
                job.events.append(ev)
                if isinstance(ev, Done):
                    result = ev.result
        if result is None:
            raise EngineError(f"{self.host.label} ended the order without its result")
        return result

    def _lab(self, job: Job, run) -> None:
        """A Lab run (lab/registry.py `LabRun`) in the host's engine process: its progress into
        `job.events` as it streams in, then `run.keep(result)` here (lab/sweeps.py)."""
        job._go.wait(HOLD_S)
        self._ready.wait(CONNECT_TIMEOUT_S)
        token = job.cancel_token
        if token.cancelled or self.state != "ready":
            return self._finish(job, error=token.reason or self.load_error, status="cancelled" if token.cancelled else None)
        ticket = LockTicket(f"{self.model}: {job.label}")  # a sweep cooks alone, not even beside its kitchen's orders
        self._on_device(job, ticket, token, lambda: self._sweep_holding(job, run, token))

    def _sweep_holding(self, job: Job, run, token) -> None:
        job.started_at, job.status = time.perf_counter(), "running"
        result, error = None, None
        try:
            job.response = stream = self.host.lab(run.key, run.settings)
            for msg in stream:
                if "progress" in msg:
                    job.events.append(msg["progress"])
                elif "result" in msg:
                    result = msg["result"]
            if result is None:
                raise EngineError(f"{self.host.label} ended the run without its result")
            result = run.keep(result) if run.keep is not None else result
        except Exception as err:  # noqa: BLE001 -- a refusal, a dropped stream or a bug: one line, the job ends
            error = str(err) if isinstance(err, EngineError) else f"the Lab run on {self.host.label} failed: " \
                f"{type(err).__name__}: {err}"  # fmt: skip
        if token.cancelled:
            return self._finish(job, error=token.reason, status="cancelled")
        self._finish(job, result=result, error=None if error is None else " ".join(error.split()))

    def _follow_board(self, job: Job) -> None:
        """While the order cooks: the class board every BOARD_S, for the live rail (serving/http/board.py).
        Only the tickets are asked for (no steps: hundreds a second while it cooks). It runs in the
        app's server process, on the server's cores, never on the engine's."""
        while not job.finished:
            board = self.board(job.order_id, NO_STEPS)
            if board is None:  # a server without a board, or one that does not answer in time
                job.board = None
                return
            job.board = board
            time.sleep(BOARD_S)

    def _finish(self, job: Job, result=None, error: str | None = None, status=None) -> None:
        job.finish(result, error, status)
        with self._lock:
            self._jobs = [j for j in self._jobs if not j.finished]

    # -- pages that went away -------------------------------------------------------------------------------------
    def _start_watcher(self) -> None:
        self._watcher.start()

    def _unfinished(self) -> list[Job]:
        with self._lock:
            return list(self._jobs)


def encode_form(form: OrderForm) -> bytes:
    """An order form as the key of its check's answer: the same form, the same bytes."""
    return json.dumps(to_json(form), sort_keys=True).encode()
