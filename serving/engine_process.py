"""The engine in its own process: the web server asks, a child process cooks.

Why a child process and not a thread: a torch op needs Python's GIL to be dispatched, and the
Streamlit server process holds that same GIL whenever it reruns a page or a fragment. With the
engine in a thread of the server, every live refresh (4x a second) stalled a decode step by
0.2 s inside the forward pass (docs/benchmarks/ui-overhead.md). A child process has its own
interpreter and its own GIL, so nothing the page does can stop the soup pot mid-ladle; the
engine's timings are measured in the child, next to the model.

Two pipes, two kinds of question:

  jobs    generate / stream / run: one at a time, served by the child's main thread (an Engine
          is not thread-safe, and the kitchen's worker already serializes jobs);
  quick   info-like questions (limits, check, encode, decode): served by a second child thread,
          so the order form can ask "how many tokens is my prompt?" while an order cooks. The
          engine documents these as safe beside a running request (tokenizer and arithmetic).

Worked example:

    proc = EngineProcess("chef", "cpu", "float32", threads=1)
    eng = proc.proxy                      # EngineProxy: what the kitchen and the lab call
    eng.info.name, eng.cfg.n_layers       # copied once, at load
    res = eng.generate(["ROMEO:"], max_new_tokens=8)   # GenerationResult, pickled back
    for ev in eng.stream(["ROMEO:"], max_new_tokens=8):  # engine events, as they happen
        ...
    eng.run(my_top_level_fn, 3, emit=print)   # my_top_level_fn(engine, 3, emit=...) in the child
    proc.close()

A refused input arrives as `EngineError` (one line); a child that dies makes the current and
every later call raise a one-line `EngineError` until `restart()`.

A child that is alive but silent (a deadlock, a wedged device) is the third failure. While a job
runs, the parent waits for the child's next message at most `Silence.limit_s()` seconds: the
larger of a floor (60 s) and 100x the time the child measured for one token at load, times the
tokens the longest silent stretch of this job may process (`stream`: the prompt pass; `generate`:
every token). Lab experiments (`run`) pace themselves, so they get a fixed 600 s. A quick question
gets 30 s: its answer is tokenizer work or arithmetic (milliseconds), and the child's second thread
answers it even mid-order, unless something holds the child's GIL (a C call that never lets go).
`TWO_POT_SILENCE_S` replaces every fixed bound. Past the limit the parent kills the child and the
job fails with one line naming the limit; the kitchen then starts a fresh child. Example, the
chef on this CPU: one token 3.3 ms, a 32-token order: 100 x 3.3 ms x 32 = 10.6 s < 60 s, so the
limit is 60 s.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engine.errors import EngineError

REPO = Path(__file__).resolve().parent.parent
PARENT_PATH = "TWO_POT_PARENT_SYS_PATH"
ALL_CORES = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
LOAD_TIMEOUT_S = 600  # the longest we wait for the child to load the weights
QUICK = ("limits", "check", "encode", "decode")  # answered beside a running job
SILENCE_ENV = "TWO_POT_SILENCE_S"  # overrides Silence.floor_s (seconds)
# Tests only: the child goes silent this long (seconds) after each event of an order it streams.
TEST_HANG_ENV = "TWO_POT_TEST_HANG_S"


@dataclass(frozen=True)
class Silence:
    """How long a running job may go without a message from the child before it counts as hung."""

    floor_s: float = 60.0  # never less than this
    per_token_steps: float = 100.0  # or this many times the measured one-token time, per token
    run_s: float = 600.0  # `run` (lab experiments): they pace themselves; a fixed bound
    quick_s: float = 30.0  # a quick question (limits, check, encode, decode)

    @classmethod
    def from_env(cls) -> Silence:
        """`TWO_POT_SILENCE_S` replaces every fixed bound (the floor, `run`'s and quick questions')."""
        floor = os.environ.get(SILENCE_ENV)
        return cls(floor_s=float(floor), run_s=float(floor), quick_s=float(floor)) if floor else cls()

    def limit_s(self, kind: str, args: tuple, kwargs: dict, token_s: float) -> float:
        """Seconds of silence allowed for one job. Example: stream, prompts of 32 tokens, one
        token measured at 3.3 ms: max(60, 100 x 0.0033 x 32) = 60 s."""
        if kind == "run":
            return self.run_s
        return max(self.floor_s, self.per_token_steps * token_s * pass_tokens(kind, args, kwargs))


def pass_tokens(kind: str, args: tuple, kwargs: dict) -> int:
    """Tokens the longest silent stretch of a job may process: the prompt pass for a stream (every
    later message follows one step), every token for a generate. Text prompts count one token per
    character (never fewer tokens than characters with the engine's tokenizers: a generous bound)."""
    prompts = args[0] if args else kwargs.get("prompts", [])
    prompt = sum(len(p) for p in prompts)
    if kind == "generate":
        new = args[1] if len(args) > 1 else kwargs.get("max_new_tokens", 64)  # Engine.generate's default
        return prompt + len(prompts) * new
    return max(prompt, len(prompts))


@dataclass(frozen=True)
class Loaded:
    """What the child reports once the weights are in: copied to the parent, read without RPC."""

    info: Any  # engine.loader.ModelInfo
    cfg: Any  # engine.config.ModelConfig
    load_s: float
    token_s: float = 0.0  # the warm-up's slowest step, seconds (one token): scales the silence limit


def warm_up(engine) -> float:
    """One tiny unshown generation right after loading, so the learner's first Cook is not the one
    paying for first-call setup. Measured on this CPU (chef, 1 thread, `JULIET:`): TTFT 5.78 ms on
    the first call after loading, then 3.37 and 3.30 ms. Returns its slowest step (seconds)."""
    res = engine.generate([[1]], max_new_tokens=2, temperature=0.0)
    return max([res.metrics.ttft_s, *res.metrics.itl_s])


class ChildFailure(RuntimeError):
    """A bug inside the child (not a refused input); `str()` is already "Type: message", one line."""


@dataclass(frozen=True)
class CoreSplit:
    engine: frozenset[int]  # the cores the engine's child keeps for its torch threads
    server: frozenset[int]  # the rest: the web server (and, if it is pinned, its pages' reruns)


def split_cores(threads: int | None) -> CoreSplit | None:
    """Give the engine its own `threads` cores (the last ones) and the server the others.

    Why: a separate process removes the shared GIL, but not the shared cores: the live view's
    stalls left were the engine being preempted inside its forward pass. On a busy shared 2-core
    machine (docs/benchmarks/ui-overhead.md) the live view's median TPOT overhead measured +50 % and
    +52 % unpinned, +13 % to +40 % with the engine on core 1 and the server on core 0: a modest gain,
    inside that machine's noise, and never worse. `TWO_POT_PIN=0` turns it off.
    Example: cores {0, 1}, threads 1 -> engine {1}, server {0}. None when no core is left over
    (threads unset, or at least as many threads as cores), or where the OS has no affinity API.
    """
    cores = sorted(ALL_CORES)
    if not threads or threads >= len(cores) or os.environ.get("TWO_POT_PIN") == "0":
        return None
    return CoreSplit(frozenset(cores[-threads:]), frozenset(cores[:-threads]))


def pin_this_process(cores: frozenset[int]) -> None:
    """Every thread of this process onto `cores` (threads started later inherit their creator's)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass


def one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


# -- the child ------------------------------------------------------------------------------------


def child_entry(argv: list[str]) -> None:
    """`python -c ... JOBS_FD QUICK_FD MODEL DEVICE DTYPE THREADS CORES`: wrap the inherited sockets.

    CORES ("1,2", or "-" for no pinning) is set first, before torch starts its threads, so every
    one of them inherits it.
    """
    jobs_fd, quick_fd, model, device, dtype, threads, cores = argv
    if cores != "-":
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    # The parent's import path, so a function it hands to `run` (pickled by module and name) imports here.
    sys.path += [p for p in os.environ.pop(PARENT_PATH, "").split(os.pathsep) if p and p not in sys.path]
    child_main(Connection(int(jobs_fd)), Connection(int(quick_fd)), model, device, dtype, int(threads))


def child_main(jobs, quick, model: str, device: str, dtype: str, threads: int | None) -> None:
    """Load, report, then serve both pipes until the parent goes away (EOF on the jobs pipe)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (engine/__init__.py)
    t0 = time.perf_counter()
    try:
        from engine import Engine  # imports torch, after the wait policy is set

        if threads:
            import torch

            torch.set_num_threads(threads)
        engine = Engine.load(model, device=device, dtype=dtype)
        token_s = warm_up(engine)
        jobs.send(("ready", Loaded(engine.info, engine.cfg, time.perf_counter() - t0, token_s)))
    except EngineError as err:
        jobs.send(("engine_error", str(err)))
        return
    except Exception as err:  # noqa: BLE001 — a bug, but the page still gets one line
        jobs.send(("error", f"could not load {model}: {one_line(err)}"))
        return
    threading.Thread(target=serve_quick, args=(engine, quick), daemon=True).start()
    serve_jobs(engine, jobs)


def answer(conn, fn: Callable, *args, **kwargs) -> None:
    """Run `fn(*args, **kwargs)` and send its result, or the error as one line (EngineError stays
    EngineError, so the page can show the engine's own sentence)."""
    try:
        conn.send(("result", fn(*args, **kwargs)))
    except EngineError as err:
        conn.send(("engine_error", str(err)))
    except Exception as err:  # noqa: BLE001 — a bug in a job: the caller gets one line
        conn.send(("error", one_line(err)))


def serve_quick(engine, conn) -> None:
    while True:
        try:
            name, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        answer(conn, getattr(engine, name), *args, **kwargs)


def serve_jobs(engine, conn) -> None:
    """One job at a time: ("generate" | "stream" | "run", args, kwargs); None ends the child."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        if msg == "cancel":  # it arrived after the stream had already ended: nothing to stop
            continue
        kind, args, kwargs = msg
        if kind == "generate":
            answer(conn, engine.generate, *args, **kwargs)
        elif kind == "stream":
            answer(conn, stream_out, engine, conn, args, kwargs)
        elif kind == "run":
            answer(conn, args[0], engine, *args[1:], emit=emitter(conn), **kwargs)


def emitter(conn) -> Callable[[Any], None]:
    """What `run`'s function calls to report progress: each object is pickled to the parent."""

    def emit(obj: Any) -> None:
        conn.send(("event", obj))

    return emit


def stream_out(engine, conn, args, kwargs) -> None:
    """Send each engine event as it happens; stop early if the parent says "cancel".

    Sending happens while the engine's clock is paused (it pauses while the consumer holds an
    event), so the pipe costs the measured TTFT/TPOT nothing.
    """
    events = engine.stream(*args, **kwargs)
    hang_s = float(os.environ.get(TEST_HANG_ENV) or 0)
    for event in events:
        conn.send(("event", event))
        if hang_s:  # a test's hung engine: alive, silent, in the middle of an order
            time.sleep(hang_s)
        if conn.poll() and conn.recv() == "cancel":
            events.close()
            return


# -- the parent -----------------------------------------------------------------------------------


class EngineProxy:
    """What pages, the kitchen's worker and the lab hold instead of an `Engine`.

    Same names as the engine (docs/engine-api.md): `info`, `cfg`, `limits`, `check`, `encode`,
    `decode`, `generate`, `stream`, plus `run(fn, *args, **kwargs)` for code that must touch the
    real engine (model internals, torch.profiler, process CPU time): `fn` must be a top-level
    function (pickled by name) and is called in the child as `fn(engine, *args, emit=..., **kwargs)`.
    """

    def __init__(self, process: EngineProcess):
        self._process = process

    @property
    def info(self):
        return self._process.loaded.info

    @property
    def cfg(self):
        return self._process.loaded.cfg

    def limits(self, *args, **kwargs):
        return self._process.ask("limits", args, kwargs)

    def check(self, *args, **kwargs):
        return self._process.ask("check", args, kwargs)

    def encode(self, *args, **kwargs):
        return self._process.ask("encode", args, kwargs)

    def decode(self, *args, **kwargs):
        return self._process.ask("decode", args, kwargs)

    def generate(self, *args, **kwargs):
        return self._process.job("generate", args, kwargs)

    def stream(self, *args, **kwargs) -> Iterator:
        return self._process.job_stream(("stream", args, kwargs))

    def run(self, fn: Callable, *args, emit: Callable[[Any], None] | None = None, **kwargs):
        """`fn(engine, *args, emit=..., **kwargs)` in the child; what it emits reaches `emit` here."""
        result = None
        for kind, value in self._process.job_messages(("run", (fn, *args), kwargs)):
            if kind == "event":
                if emit is not None:
                    emit(value)
            else:
                result = value
        return result


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
    ):
        """`threads`: the child's torch threads; with cores to spare the child keeps that many
        cores for itself (`split_cores`). `pin_server=True` (the app) also moves this process onto
        the other cores, so the server's page reruns never run on the engine's core. `silence`:
        when a running job counts as hung (default: `Silence.from_env()`)."""
        self.model, self.device, self.dtype, self.threads = model, device, dtype, threads
        self.silence = silence or Silence.from_env()
        self.cores = split_cores(threads)
        if pin_server and self.cores is not None:
            pin_this_process(self.cores.server)
        self.loaded: Loaded | None = None
        self.proxy = EngineProxy(self)
        self._job_lock, self._quick_lock = threading.Lock(), threading.Lock()
        self._start()

    def _start(self) -> None:
        """A fresh interpreter (`python -c`), handed one end of two socket pairs.

        Why not `multiprocessing`'s spawn: it re-runs the parent's main script in the child, and
        under Streamlit the main script is app.py (it would draw a page with no session). A plain
        subprocess imports only this module. Its own session keeps a Ctrl-C in the terminal for the
        server; the child exits when the server's end of the jobs pipe closes.
        """
        jobs, child_jobs = socket.socketpair()
        quick, child_quick = socket.socketpair()
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env[PARENT_PATH] = os.pathsep.join(sys.path)
        fds = (child_jobs.fileno(), child_quick.fileno())
        code = "import sys; from kitchen_viz.engine_process import child_entry; child_entry(sys.argv[1:])"
        cores = ",".join(map(str, sorted(self.cores.engine))) if self.cores else "-"
        args = [*map(str, fds), self.model, self.device, self.dtype, str(self.threads or 0), cores]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], pass_fds=fds, env=env, cwd=REPO, start_new_session=True
        )
        child_jobs.close()  # only the child holds these ends now, so its death reads as EOF here
        child_quick.close()
        self._jobs, self._quick = Connection(jobs.detach()), Connection(quick.detach())
        if not self._jobs.poll(LOAD_TIMEOUT_S):
            self.close()
            raise EngineError(f"loading {self.model} took longer than {LOAD_TIMEOUT_S} s; gave up")
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
                f"the engine process for {self.model} stopped (exit code {code}); the kitchen restarts it "
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
        what = f"no answer to {waiting_for}" if waiting_for else "nothing"
        raise EngineError(
            f"the engine process for {self.model} sent {what} for {limit_s:,.0f} s (the limit "
            f"for {'a quick question' if waiting_for else 'this order'}) and was stopped as hung; "
            "the kitchen restarts it for the next order"
        )

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

        Between two messages the child may be silent at most the job's silence limit."""
        kind, args, kwargs = msg
        limit_s = self.silence.limit_s(kind, args, kwargs, self.loaded.token_s)
        with self._job_lock:
            self._send(self._jobs, msg)
            while True:
                kind, value = self._recv(self._jobs, limit_s)
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

    def _send(self, conn, msg) -> None:
        try:
            conn.send(msg)
        except (OSError, ValueError) as err:
            code = self._proc.poll()
            raise EngineError(
                f"the engine process for {self.model} is not running (exit code {code}); the kitchen "
                "restarts it for the next order"
            ) from err
