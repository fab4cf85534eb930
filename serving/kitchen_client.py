"""The Kitchen page's kitchen on a kitchen host: the app as a client of the class kitchen.

`two-pot-kitchen` serves its kitchens inside the app's own server (serving/mounted.py) and the
Kitchen orders from them in process (serving/kitchen_orders.py `LocalHost`); with `--backend URL` it orders
from a `two-pot-kitchen serve` across the room over HTTP (`HttpHost`). One client, one code path
for local and remote, and no HTTP request from the app to itself. Every browser session's order goes to the server at once and joins the
same continuous batch as the class's requests, so a learner who presses Cook while the class is
cooking sees the rush inside their own order (serving/kitchen_orders.py streams its events).

`ServerKitchen` is the one kitchen the pages use (state, info, limits, check, submit, cancel, the
place in line), whatever the launch:

    svc = ServerKitchen("http://GPU-BOX:8000", model="chef")   # a URL, or any serving.host.KitchenHost
    svc.wait_ready(60)
    job = svc.submit(cook(order), order.label)      # kitchen_viz/orders.py: the order travels, not code
    job.wait(60); job.result                        # the GenerationResult the server's engine built

Orders of one kitchen are not served one after another: the host's scheduler seats them in one
batch. Only another kitchen's order or a Lab sweep on the same machine makes one wait (the stove,
serving/stove.py), and the host restarts an engine that died or went silent (serving/engine_client.py).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from engine.errors import EngineError
from engine.limits import Limits
from engine.loader import ModelInfo
from serving.catalog import describe, load_catalog
from serving.cores import ALL_CORES, split_cores
from serving.host import NOT_TWO_POT, HttpHost, KitchenHost, NotReady, StreamClosed
from serving.job import HOLD_S, Job, PageWatcher, record_run
from serving.order_wire import from_wire
from serving.stove import StoveMeter, StoveTicket, stove_for

CONNECT_TIMEOUT_S = 600.0  # the longest we wait for the server to load the model
POLL_S = 0.25
BOARD_S = 0.5  # how often the live rail is refreshed while an order cooks
NO_STEPS = 2**62  # `since` past every step: a board with its tickets and no steps
PENDING_BOARD = {"tickets": [], "pending": True}  # an order's board before its first read


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


class ServerKitchen:
    """One model's kitchen on a kitchen host: a `serving.host.KitchenHost`, or the URL of one."""

    def __init__(self, host: KitchenHost | str, model: str, device: str = "cpu", dtype: str = "float32",
                 api_key: str | None = None, run_log=None):  # fmt: skip
        self.host = HttpHost(host, api_key) if isinstance(host, str) else host
        self.model, self.device, self.dtype = model, device, dtype
        self.run_log = run_log
        self.state, self.load_error = "loading", None
        self.info = None  # engine.loader.ModelInfo, once the host has the model loaded
        self.threads: int | None = None
        self.engine_pid: int | None = None
        self.about: dict = {}
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
        self.foreign = False  # True: the server answers but is not a Two-Pot kitchen server (vLLM, llama.cpp)
        self._closed = False
        self.weights_mb = weights_megabytes(model, dtype)
        self.stove = stove_for(device)  # one stove per machine: another model's kitchen waits (serving/stove.py)
        self._watcher = PageWatcher(f"kitchen-watch-{model}", self._unfinished, lambda: self._closed)
        threading.Thread(target=self._connect, daemon=True, name=f"kitchen-client-{model}").start()

    # -- the host ------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Ask the host about its model until it has it loaded (`NotReady` while it loads)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        last = "no answer yet"
        while not self._closed and time.monotonic() < deadline:
            try:
                about = self.host.about()
                if about.get("name") != self.model:
                    last = (f"it serves '{about.get('name')}' only: choose that model in the sidebar "
                            "(a kitchen server cooks one model)")  # fmt: skip
                    break
                self.about = about
                self.info = ModelInfo(**about["info"])
                self.threads, self.engine_pid = about.get("threads"), about.get("pid")
                self.state = "ready"
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
        self.state, self.load_error = "error", f"{self.host.label} did not serve {self.model}: {last}"
        self._ready.set()

    @property
    def where(self) -> str:
        """Where the engine runs, for the page's caption."""
        return f"on {self.host.label} (engine pid {self.engine_pid})"

    def board(self, order_id: str, since: int | None = None) -> dict | None:
        """The class board with this order's tickets marked (serving/class_board.py), its steps after
        `since` (None: every step it keeps); None if unreadable."""
        return self.host.board(order_id, since=-1 if since is None else since)

    @property
    def loading_message(self) -> str:
        if isinstance(self.host, HttpHost):
            return f"the kitchen server is loading {self.model} on {self.device} ({self.dtype})"
        size = f"{self.weights_mb:,.1f} MB" if self.weights_mb else "weights"
        return f"loading weights: {size} of {self.model} on {self.device} ({self.dtype})"

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    # -- the order form's questions --------------------------------------------------------------------------
    def limits(self, prompt_len: int, max_new_tokens: int):
        return Limits(**self._ready_host().limits(prompt_len, max_new_tokens))

    def check(self, prompts: list, max_new_tokens: int, **settings) -> list[list[int]]:
        return self._ready_host().check({"prompts": prompts, "max_new_tokens": max_new_tokens} | settings)

    def encode(self, text: str) -> list[int]:
        return self.check([text], 1)[0]

    def _ready_host(self) -> KitchenHost:
        if self.state != "ready":
            raise EngineError(self.load_error or f"{self.model} is still loading on the kitchen server")
        return self.host

    # -- orders ------------------------------------------------------------------------------------------------
    def submit(self, work, label: str, hold: bool = False, time_limit_s: float | None = None,
               time_limit_line: str = "") -> Job:  # fmt: skip
        """Send the order `work` carries (kitchen_viz/orders.py `Cook`) to the server; returns its job at once.
        `hold`: the job waits for its page's `job.release(settle_s)` (at most HOLD_S) before it cooks;
        past `time_limit_s` it is cancelled with `time_limit_line`."""
        order = getattr(work, "order", None)
        if order is None and not hasattr(work, "settings"):
            raise EngineError("a kitchen server cooks the Kitchen's orders (kitchen_viz/orders.py `Cook`) and the "
                              "Lab's runs (lab/registry.py `LabRun`), not other code")  # fmt: skip
        job = Job.new(label, work, self, hold, time_limit_s, time_limit_line)
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
        self.stove.wake()  # a job waiting in the stove's line leaves it at once
        if job.response is not None:
            job.response.close()  # the reading thread wakes at once; the host cancels at its next step
        return True

    def queue_length(self) -> int:
        with self._lock:
            return sum(not j.finished for j in self._jobs)

    def _place_of(self, job: Job) -> int:
        """Its place in the machine's stove line (serving/stove.py), while another kitchen or a Lab
        sweep cooks; 0 otherwise: this kitchen's orders cook together, seated by the host's scheduler."""
        return self.stove.place_of(job._ticket) if job._ticket is not None else 0

    def close(self) -> None:
        """Cancel this kitchen's orders and let go of its host (the host's own kitchen keeps cooking)."""
        self._closed = True
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            self.cancel(job, "the kitchen closed before this order was cooked")
        self.host.close()

    # -- one order, on its own thread -----------------------------------------------------------------------------
    def _cook(self, job: Job, order) -> None:
        job._go.wait(HOLD_S)
        token = job.cancel_token
        ticket = StoveTicket(f"{self.model}: {job.label}", kitchen=f"{self.host.label} {self.model}")
        self._on_stove(job, ticket, token, lambda: self._cook_on_stove(job, order, token))

    def _on_stove(self, job: Job, ticket: StoveTicket, token, work) -> None:
        """Run `work()` holding the machine's stove (serving/stove.py); a cancel while the job waits
        in the stove's line ends it there."""
        job._ticket = ticket
        if token.cancelled or not self.stove.take(ticket, cancelled=lambda: token.cancelled):
            return self._finish(job, error=token.reason, status="cancelled")
        try:
            work()
        finally:
            self.stove.give_back(ticket)

    def _cook_on_stove(self, job: Job, order, token) -> None:
        if not token.cancelled:
            self._ready.wait(CONNECT_TIMEOUT_S)
            job.started_at, job.status = time.perf_counter(), "running"  # the end of its wait
            time.sleep(job.settle_s)
        if token.cancelled:
            return self._finish(job, error=token.reason, status="cancelled")
        if self.state != "ready":
            return self._finish(job, error=self.load_error or "the model is not loaded")
        timer = None
        if job.time_limit_s is not None:
            timer = threading.Timer(job.time_limit_s, self.cancel, (job, job.time_limit_line))
            timer.daemon = True
        try:
            body = {"model": self.about.get("name", self.model), "prompts": order.prompts(self),
                    "max_new_tokens": order.max_new_tokens, "temperature": order.temperature, "seed": order.seed,
                    "reuse_prefix": order.reuse_prefix}  # fmt: skip
            if timer is not None:
                timer.start()
            meter = self._meter()
            result = self._stream(job, body)
            job.shared_stove = meter.verdict() if meter is not None else None
        except (httpx.HTTPError, RuntimeError) as err:  # a closed stream (Cancel) reads as one of these
            if token.cancelled or isinstance(err, StreamClosed):
                return self._finish(job, error=token.reason, status="cancelled")
            return self._finish(job, error=f"{self.host.label} stopped answering: {type(err).__name__}: {err}")
        except ValueError as err:  # an EngineError (the server's line), or a stream the Kitchen cannot read
            if token.cancelled:
                return self._finish(job, error=token.reason, status="cancelled")
            line = str(err) if isinstance(err, EngineError) else f"{self.host.label} sent what the Kitchen " \
                f"cannot read: {err}"  # fmt: skip
            return self._finish(job, error=" ".join(line.split()))
        except Exception as err:  # noqa: BLE001 -- a bug must still end the job, in one line
            return self._finish(job, error=" ".join(f"the Kitchen could not follow this order: {type(err).__name__}: "
                                                    f"{err}".split()))  # fmt: skip
        finally:
            if timer is not None:
                timer.cancel()
        record_run(self.run_log, self.model, self.device, job, result)
        self._finish(job, result=result)

    def _meter(self) -> StoveMeter | None:
        """What else used the engine's cores while an order cooks: measurable when the engine runs
        on this machine's CPU (a host in this process), on the cores its loop was pinned to."""
        if isinstance(self.host, HttpHost) or self.device != "cpu":
            return None
        try:  # the engine's process now: the host replaces one that died or hung
            self.engine_pid = self.host.about().get("pid") or self.engine_pid
        except EngineError:
            return None
        if not self.engine_pid:
            return None
        split = split_cores(self.threads)
        return StoveMeter(split.engine if split is not None else ALL_CORES, self.engine_pid)

    def _stream(self, job: Job, body: dict):
        """Send the order and fold its events into `job.events`; returns the GenerationResult."""
        result = None
        job.response = stream = self.host.order(body)
        for msg in stream:
            if "order" in msg:
                job.order_id = msg["order"]  # names its tickets on the class board
                threading.Thread(target=self._follow_board, args=(job,), daemon=True).start()
                continue
            for d in msg["events"] if "events" in msg else [msg]:
                if not isinstance(d, dict):
                    raise ValueError(f"an event must be a JSON object (got {json.dumps(d)[:60]})")
                ev = from_wire(d)
                job.events.append(ev)
                if d["type"] == "done":
                    result = ev.result
        if result is None:
            raise EngineError(f"{self.host.label} ended the order without its result")
        return result

    def _lab(self, job: Job, run) -> None:
        """A Lab run (lab/registry.py `LabRun`) in the host's engine process: its progress into
        `job.events` as it streams in, then `run.keep(result)` here (lab/on_server.py)."""
        job._go.wait(HOLD_S)
        self._ready.wait(CONNECT_TIMEOUT_S)
        token = job.cancel_token
        if token.cancelled or self.state != "ready":
            return self._finish(job, error=token.reason or self.load_error, status="cancelled" if token.cancelled else None)
        ticket = StoveTicket(f"{self.model}: {job.label}")  # a sweep cooks alone, not even beside its kitchen's orders
        self._on_stove(job, ticket, token, lambda: self._sweep_on_stove(job, run, token))

    def _sweep_on_stove(self, job: Job, run, token) -> None:
        job.started_at, job.status = time.perf_counter(), "running"
        result, error = None, None
        try:
            job.response = stream = self.host.lab(run.key, run.settings, run.run)
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
        """While the order cooks: the class board every BOARD_S, for the live rail (serving/class_board.py).
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
