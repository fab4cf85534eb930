"""The engine's child process: load the model, then answer the parent on two pipes.

The parent (serving/engine_process.py) starts it as a fresh interpreter:

    python -c "from serving.child import child_entry; ..." JOBS_FD QUICK_FD MODEL DEVICE DTYPE THREADS CORES

  jobs    generate / stream / run: one at a time, served by the child's main thread (an Engine
          is not thread-safe, and the kitchen's worker already serializes jobs);
  quick   info-like questions (limits, check, encode, decode): served by a second thread, so the
          order form can ask "how many tokens is my prompt?" while an order cooks. The engine
          documents these as safe beside a running request (tokenizer and arithmetic).

Every answer is one message: ("result", value), ("event", obj) while a job works, or an error as
one line: ("engine_error", line) for a refused input, ("error", "Type: message") for a bug. A
"cancel" on the jobs pipe stops a stream at its next event. This module imports only `engine`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from engine.errors import EngineError
from serving.watchdog import TEST_HANG_ENV

PARENT_PATH = "TWO_POT_PARENT_SYS_PATH"  # the parent's sys.path, so `run`'s functions import here
ENTRY_CODE = "import sys; from serving.child import child_entry; child_entry(sys.argv[1:])"


@dataclass(frozen=True)
class Loaded:
    """What the child reports once the weights are in: copied to the parent, read without RPC."""

    info: Any  # engine.loader.ModelInfo
    cfg: Any  # engine.config.ModelConfig
    load_s: float
    token_s: float = 0.0  # the warm-up's slowest step, seconds (one token): scales the silence limit


def one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def warm_up(engine) -> float:
    """One tiny unshown generation right after loading, so the learner's first Cook does not pay
    for first-call setup (its TTFT measured ~1.7x the later ones). Returns its slowest step (s)."""
    res = engine.generate([[1]], max_new_tokens=2, temperature=0.0)
    return max([res.metrics.ttft_s, *res.metrics.itl_s])


def child_entry(argv: list[str]) -> None:
    """Wrap the inherited sockets and serve. CORES ("1,2", or "-" for no pinning) is set first,
    before torch starts its threads, so every one of them inherits it."""
    jobs_fd, quick_fd, model, device, dtype, threads, cores = argv
    if cores != "-":
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    sys.path += [p for p in os.environ.pop(PARENT_PATH, "").split(os.pathsep) if p and p not in sys.path]
    child_main(Connection(int(jobs_fd)), Connection(int(quick_fd)), model, device, dtype, int(threads))


def child_main(jobs, quick, model: str, device: str, dtype: str, threads: int | None) -> None:
    """Load, report, then serve both pipes until the parent goes away (EOF on the jobs pipe)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (engine/__init__.py)
    t0 = time.perf_counter()
    try:
        from engine import Engine  # lazy: torch loads after OMP_WAIT_POLICY is set

        if threads:
            import torch  # lazy: after the wait policy, as above

            torch.set_num_threads(threads)
        from engine.quant import precision_parts  # lazy: imports torch, as above

        dtype, quant = precision_parts(dtype)  # the app's Precision may be "int8"
        engine = Engine.load(model, device=device, dtype=dtype, quant=quant)
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
