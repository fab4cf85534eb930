"""The Kitchen page's kitchen on a kitchen server: the app as a client of the class kitchen.

`two-pot-kitchen` serves a kitchen on its own port (serving/mounted.py) and the Kitchen orders
from it over HTTP, exactly as it would from a `two-pot-kitchen serve` across the room: one code
path for local and remote. Every browser session's order goes to the server at once and joins the
same continuous batch as the class's requests, so a learner who presses Cook while the class is
cooking sees the rush inside their own order (serving/kitchen_orders.py streams its events).

`ServerKitchen` has the surface the pages use on a `KitchenService` (state, info, limits, check,
submit, cancel, the place in line), so the page code is the same for both:

    svc = ServerKitchen("http://127.0.0.1:8501/class", model="chef")
    svc.wait_ready(60)
    job = svc.submit(cook(order), order.label)      # kitchen_viz/orders.py: the order travels, not code
    job.wait(60); job.result                        # the GenerationResult the server's engine built

What differs, on purpose: orders are not served one after another by a worker here (the server's
scheduler decides who cooks in each step), and a server whose engine dies restarts it itself.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from engine.errors import EngineError
from engine.limits import Limits
from engine.loader import ModelInfo
from serving.job import Job
from serving.lab_wire import decode, encode
from serving.order_wire import from_wire
from serving.remote_order import board
from serving.service import HOLD_S, WATCH_S, cancel_abandoned, record_run

CONNECT_TIMEOUT_S = 600.0  # the longest we wait for the server to load the model
POLL_S = 0.25
BOARD_S = 0.5  # how often the live rail is refreshed while an order cooks
NO_STEPS = 2**62  # `since` past every step: a board with its tickets and no steps
PENDING_BOARD = {"tickets": [], "pending": True}  # an order's board before its first read


class ServerKitchen:
    """One model's kitchen on a kitchen server at `url` (the address /kitchen/* and /v1/* hang under)."""

    def __init__(self, url: str, model: str, device: str = "cpu", dtype: str = "float32", api_key: str | None = None,
                 run_log=None):  # fmt: skip
        self.url, self.model, self.device, self.dtype = url.rstrip("/"), model, device, dtype
        self.run_log = run_log
        self.state, self.load_error = "loading", None
        self.info = None  # engine.loader.ModelInfo, once the server has the model loaded
        self.threads: int | None = None
        self.engine_pid: int | None = None
        self.about: dict = {}
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One client for every request (keep-alive, one TLS setup): the board is read twice a second
        # while an order cooks, in the process whose cores the browser shares with the engine.
        self._http = httpx.Client(headers=self._headers, timeout=httpx.Timeout(30.0, read=None))
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
        self._closed = False
        self._watcher: threading.Thread | None = None
        threading.Thread(target=self._connect, daemon=True, name=f"kitchen-client-{model}").start()

    # -- the server ------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Ask /kitchen/model until the server has the model (503 while it loads)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        last = "no answer yet"
        while not self._closed and time.monotonic() < deadline:
            try:
                r = self._http.get(self.url + "/kitchen/model", timeout=10)
                if r.status_code == 200 and r.json().get("name") != self.model:
                    last = (f"it serves '{r.json().get('name')}' only: choose that model in the sidebar "
                            "(a kitchen server cooks one model)")  # fmt: skip
                    break
                if r.status_code == 200:
                    self.about = r.json()
                    self.info = ModelInfo(**self.about["info"])
                    self.threads, self.engine_pid = self.about.get("threads"), self.about.get("pid")
                    self.state = "ready"
                    self._ready.set()
                    return
                last = error_line(r)
                if r.status_code == 404 and "/kitchens/" not in self.url:
                    last = ("it has no /kitchen/model, so it is not a Two-Pot kitchen server and the Kitchen cannot "
                            "draw its orders; the Class order page works with any OpenAI-compatible server")  # fmt: skip
                if r.status_code != 503:  # 503: still loading; anything else will not get better
                    break
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
                last = f"{type(err).__name__}: {err}"
            time.sleep(POLL_S)
        self.state, self.load_error = "error", f"the kitchen server at {self.url} did not serve {self.model}: {last}"
        self._ready.set()

    @property
    def where(self) -> str:
        """Where the engine runs, for the page's caption."""
        return f"on the kitchen server at {self.url} (engine pid {self.engine_pid})"

    def board(self, order_id: str, since: int | None = None) -> dict | None:
        """The class board with this order's tickets marked (serving/class_board.py), its steps after
        `since` (None: every step it keeps); None if unreadable."""
        return board(self.url, order_id, since=-1 if since is None else since, client=self._http)

    @property
    def loading_message(self) -> str:
        return f"the kitchen server is loading {self.model} on {self.device} ({self.dtype})"

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def revive_if_dead(self) -> bool:
        """Never needed here: the server starts a new engine itself if its engine process dies."""
        return False

    # -- the order form's questions --------------------------------------------------------------------------
    def limits(self, prompt_len: int, max_new_tokens: int):
        return Limits(**self._post("/kitchen/limits", {"prompt_tokens": prompt_len, "max_new_tokens": max_new_tokens}))

    def check(self, prompts: list, max_new_tokens: int, **settings) -> list[list[int]]:
        body = {"prompts": prompts, "max_new_tokens": max_new_tokens} | settings
        return self._post("/kitchen/check", body)["prompt_ids"]

    def encode(self, text: str) -> list[int]:
        return self.check([text], 1)[0]

    def _post(self, path: str, body: dict) -> Any:
        if self.state != "ready":
            raise EngineError(self.load_error or f"{self.model} is still loading on the kitchen server")
        try:
            r = self._http.post(self.url + path, json=body, timeout=30)
        except httpx.HTTPError as err:
            raise EngineError(f"the kitchen server at {self.url} did not answer: {type(err).__name__}: {err}") from None
        if r.status_code != 200:
            raise EngineError(error_line(r))
        return r.json()

    # -- orders ------------------------------------------------------------------------------------------------
    def submit(self, work, label: str, hold: bool = False, time_limit_s: float | None = None,
               time_limit_line: str = "") -> Job:  # fmt: skip
        """Send the order `work` carries (kitchen_viz/orders.py `Cook`) to the server; returns its job at once.
        `hold`, `time_limit_s` and `time_limit_line` mean what they mean for `KitchenService.submit`."""
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
        if job.response is not None:
            job.response.close()  # the reading thread wakes with an error; the server cancels at its next step
        return True

    def queue_length(self) -> int:
        with self._lock:
            return sum(not j.finished for j in self._jobs)

    def _place_of(self, job: Job) -> int:
        """Nobody waits in a line of ours: the server's scheduler seats each order at its next step."""
        return 0

    def close(self) -> None:
        self._closed = True
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            self.cancel(job, "the kitchen closed before this order was cooked")

    # -- one order, on its own thread -----------------------------------------------------------------------------
    def _cook(self, job: Job, order) -> None:
        job._go.wait(HOLD_S)
        token = job.cancel_token
        if not token.cancelled:
            self._ready.wait(CONNECT_TIMEOUT_S)
            job.started_at, job.status = time.perf_counter(), "running"  # the end of its wait, as in KitchenService
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
                    "max_new_tokens": order.max_new_tokens, "temperature": order.temperature, "seed": order.seed}  # fmt: skip
            if timer is not None:
                timer.start()
            result = self._stream(job, body)
        except (httpx.HTTPError, RuntimeError) as err:  # a closed response (Cancel) reads as one of these
            if token.cancelled:
                return self._finish(job, error=token.reason, status="cancelled")
            return self._finish(job, error=f"the kitchen server at {self.url} stopped answering: {type(err).__name__}: {err}")
        except ValueError as err:  # an EngineError (the server's line), or a stream the Kitchen cannot read
            if token.cancelled:
                return self._finish(job, error=token.reason, status="cancelled")
            line = str(err) if isinstance(err, EngineError) else f"the kitchen server at {self.url} sent what the " \
                f"Kitchen cannot read: {err}"  # fmt: skip
            return self._finish(job, error=" ".join(line.split()))
        except Exception as err:  # noqa: BLE001 -- a bug must still end the job, in one line
            return self._finish(job, error=" ".join(f"the Kitchen could not follow this order: {type(err).__name__}: "
                                                    f"{err}".split()))  # fmt: skip
        finally:
            if timer is not None:
                timer.cancel()
        record_run(self.run_log, self.model, self.device, job, result)
        self._finish(job, result=result)

    def _messages(self, job: Job, path: str, body: dict):
        """POST `body` and yield each server-sent message (a JSON object) as it arrives; the
        response is kept on the job (Cancel closes it), and an error message raises its one line."""
        with self._http.stream("POST", self.url + path, json=body) as r:
            job.response = r
            if r.status_code != 200:
                raise EngineError(error_line(r, r.read()))
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                msg = json.loads(line[6:])
                if not isinstance(msg, dict):
                    raise ValueError(f"an event must be a JSON object (got {line[6:80]})")
                if "error" in msg:
                    raise EngineError(msg["error"].get("message", "the kitchen server sent an error"))
                yield msg

    def _stream(self, job: Job, body: dict):
        """POST the order and fold its events into `job.events`; returns the GenerationResult."""
        result = None
        for msg in self._messages(job, "/kitchen/orders", body):
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
            raise EngineError(f"the kitchen server at {self.url} ended the order without its result")
        return result

    def _lab(self, job: Job, run) -> None:
        """A Lab run (lab/registry.py `LabRun`) in the server's engine process: its progress into
        `job.events` as it streams in, then `run.keep(result)` here (lab/on_server.py)."""
        job._go.wait(HOLD_S)
        self._ready.wait(CONNECT_TIMEOUT_S)
        token = job.cancel_token
        if token.cancelled or self.state != "ready":
            return self._finish(job, error=token.reason or self.load_error, status="cancelled" if token.cancelled else None)
        job.started_at, job.status = time.perf_counter(), "running"
        result, error = None, None
        try:
            for msg in self._messages(job, f"/kitchen/lab/{run.key}", {"settings": encode(run.settings)}):
                if "progress" in msg:
                    job.events.append(decode(msg["progress"]))
                elif "result" in msg:
                    result = decode(msg["result"])
            if result is None:
                raise EngineError(f"the kitchen server at {self.url} ended the run without its result")
            result = run.keep(result) if run.keep is not None else result
        except Exception as err:  # noqa: BLE001 -- a refusal, a dropped stream or a bug: one line, the job ends
            error = str(err) if isinstance(err, EngineError) else f"the Lab run on {self.url} failed: {type(err).__name__}: {err}"
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
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, daemon=True, name=f"kitchen-watch-{self.model}")
                self._watcher.start()

    def _watch(self) -> None:
        while not self._closed:
            with self._lock:
                jobs = [j for j in self._jobs if j._alive is not None and not j.finished]
            cancel_abandoned(jobs)
            time.sleep(WATCH_S)


def error_line(r: httpx.Response, raw: bytes | None = None) -> str:
    """The server's one-line error (OpenAI's error object), or the status and the start of the body."""
    raw = r.content if raw is None else raw
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:200].decode(errors="replace")
    return " ".join(f"HTTP {r.status_code}: {message}".split())
