"""The host's engine process: one Engine, one step loop, every client's order in it.

The host (serving/host/host.py) never touches torch: it starts this loop as a child process and
talks to it over one pipe (serving/host/process.py). The loop owns the Engine (an Engine is not
thread-safe), so every check, submit and cancel is a message it applies between two steps, and
every step's news goes back as one message. Orders from different clients join the same running
batch at the next step. The messages are serving/host/wire.py's; `Loop.handlers` is the one table
that dispatches them.

`main(conn, settings, sweeps, environment)` is the child's entry, started by serving/host/spawn.py
(forked from the fork server on Linux, a fresh interpreter elsewhere). `sweeps` is what runs the
Lab's experiments by key (lab/sweeps.py), given by whoever started the host; None: this loop runs
no sweeps.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine import Engine, EngineError
from engine.events import Done, StepEnd, Token
from engine.request_group import RequestGroup, shared_check
from engine.sampling import skip_draws
from engine.settings import EngineSettings
from engine.text import encode_prompts
from serving.cores import pin_this_process
from serving.heap import freeze_heap
from serving.host import wire
from serving.host.api import OrderForm, generated_prompts, word_starts
from serving.host.wire import QueueState, ReadyInfo, StepInfo, StepNews

TEST_HANG_ENV = "TWO_POT_TEST_HANG_S"  # a test hook: the loop pauses this many seconds after every step
POISON_ENV = "TWO_POT_TEST_POISON"  # a test hook: "kill:WORD" or "hang:WORD", see `Poison`
TRACE_ENV = "TWO_POT_TEST_TRACE"  # a test hook: the files the first order enters here, down to its forward pass
IDLE_POLL_S = 1.0  # an idle loop wakes this often to notice a parent that went away
BATCH_S = 0.05  # while only Kitchen orders cook, their steps go to the host together this often


@dataclass(frozen=True)
class LoopSettings:
    """What the loop loads (`model`, with `engine`'s settings), its torch threads and its cores."""

    model: str = "chef"
    engine: EngineSettings = field(default_factory=lambda: EngineSettings(policy="chunked", prefix_cache=True))
    threads: int = 0  # 0: torch's default
    cores: tuple[int, ...] = ()  # pin the loop's process to these cores (serving/cores.py); () = any


def main(conn, settings: LoopSettings, sweeps, environment: dict) -> None:
    """The child's entry: take the parent's `environment` (a loop forked from the fork server starts
    with the server's, serving/host/spawn.py), pin, load, say Ready (or LoadError), then run until
    Stop or EOF."""
    os.environ.clear()
    os.environ.update(environment)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle: it stops its loops
    if settings.cores:
        pin_this_process(frozenset(settings.cores))  # before torch starts its threads: they inherit these cores
    engine = load(conn, settings)
    if engine is not None:
        freeze_heap()  # the loaded engine stays out of the full collections that would stall a step
        trace = os.environ.get(TRACE_ENV)
        Loop(conn, engine, settings.model, sweeps, OrderTrace(trace) if trace else None).run()


def load(conn, s: LoopSettings) -> Engine | None:
    """Load and warm up the engine, then say Ready; or say LoadError (one line) and return None."""
    t0 = time.perf_counter()
    try:
        if s.threads:
            torch.set_num_threads(s.threads)
        engine = Engine.load(s.model, s.engine)
        engine.submit([1], 2)  # first-call setup stays out of the first student's TTFT
        while not engine.idle:
            engine.step()
    except Exception as err:  # noqa: BLE001 -- the parent gets one line, whatever went wrong
        conn.send_bytes(wire.encode(wire.LoadError(" ".join(f"could not load {s.model}: {err}".split()))))
        return None
    codec, cfg = engine.codec, engine.cfg
    info = ReadyInfo(engine.info.name, str(engine.device), engine.info.precision, s.engine.policy, cfg.max_context,
                     cfg.vocab_size, getattr(codec, "chat_template", None), getattr(codec, "bos_token", ""),
                     getattr(codec, "eos_token", ""), time.perf_counter() - t0, engine.info,
                     engine.serving_limits(), s.engine.token_budget, s.engine.batch_invariant)  # fmt: skip
    conn.send_bytes(wire.encode(wire.Ready(info)))
    return engine


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def order_prompts(engine: Engine, form: OrderForm) -> list:
    """The form's prompts; generated ones cut from its filler by this engine's own tokenizer (a
    model without one gets in-vocabulary ids: its text is noise anyway)."""
    if form.filler is None:
        return form.prompts
    if engine.codec is None:
        filler = [(7919 * i) % engine.cfg.vocab_size for i in range(1, 257)]
        return generated_prompts(filler, max(1, form.prompt_tokens), form.tables)
    filler, starts = filler_words(engine, form.filler)
    return generated_prompts(filler, max(1, form.prompt_tokens), form.tables, starts)


@functools.lru_cache(maxsize=4)
def _filler_words(engine: Engine, filler: str) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    ids = engine.encode(filler)
    return tuple(ids), tuple(word_starts(ids, engine.decode))


def filler_words(engine: Engine, filler: str) -> tuple[list[int], list[bool]]:
    """The filler's ids and where its words start (decoded once per engine and filler)."""
    ids, starts = _filler_words(engine, filler)
    return list(ids), list(starts)


@dataclass(frozen=True)
class Poison:
    """The test hook behind POISON_ENV: a request whose text prompt (an order: whose prompt's text) holds `word` crashes this
    process at the step that makes its first token, before that step's news leaves: "kill" kills
    the process (SIGKILL), "hang" leaves it alive and silent (the host's watchdog stops it). A
    resubmitted request keeps its text prompt, so it crashes the fresh process too: a poison order."""

    mode: str
    word: str

    @staticmethod
    def from_env() -> Poison | None:
        mode, _, word = os.environ.get(POISON_ENV, "").partition(":")
        return Poison(mode, word) if mode in ("kill", "hang") and word else None

    def strike(self) -> None:
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)


class SweepCancelled(Exception):
    """The sweep's client went away (or the loop stops): the sweep ends at its next point."""


class Loop:
    """The step loop and what it remembers between steps: which key each engine request has."""

    def __init__(self, conn, engine: Engine, source: str = "", sweeps=None, trace: OrderTrace | None = None):
        self.conn, self.engine, self.trace = conn, engine, trace
        self.engine_source = source  # what the engine was loaded from: a sweep's engine loads it too
        self.sweeps_runner = sweeps
        self.key_of: dict[int, str] = {}  # engine request id -> the host's key ("r3", "o1/0")
        self.id_of: dict[str, int] = {}
        self.arrived: dict[str, float] = {}
        self.orders: dict[str, RequestGroup] = {}
        self.held: list[StepNews] = []  # steps not yet sent (see BATCH_S)
        self.sent_at = time.perf_counter()
        self.hang_s = float(os.environ.get(TEST_HANG_ENV) or 0)
        self.poison, self.poisoned = Poison.from_env(), set()  # the poison test hook: its requests' ids
        self.sweeps: list[wire.RunSweep] = []  # waiting for the engine to be idle
        self.backlog: list = []  # messages that arrived while a sweep ran
        self.sweep_engine: Engine | None = None
        self.handlers = {wire.Submit: self.submit, wire.Check: self.check, wire.PlaceOrder: self.place_order,
                         wire.RunSweep: self.sweeps.append, wire.Cancel: self.cancel,
                         wire.ClearLeftovers: lambda m: self.engine.clear_leftovers(set(m.origins))}  # fmt: skip

    def send_msg(self, msg) -> None:
        self.conn.send_bytes(wire.encode(msg))

    def receive(self):
        return wire.decode(self.conn.recv_bytes())

    def run(self) -> None:
        """Apply everything that arrived, then step; a sweep once nothing cooks; until Stop or the
        parent goes away."""
        conn, engine = self.conn, self.engine
        while True:
            busy = not engine.idle or self.sweeps or self.backlog
            if not conn.poll(0 if busy else IDLE_POLL_S) and not busy:
                continue
            while self.backlog or conn.poll(0):
                try:
                    msg = self.backlog.pop(0) if self.backlog else self.receive()
                except (EOFError, OSError):
                    return
                if isinstance(msg, wire.Stop):
                    return
                if self.trace is not None and isinstance(msg, wire.Check | wire.PlaceOrder):
                    self.trace.start()
                self.handlers[type(msg)](msg)
            if not engine.idle:
                self.step()
            elif self.sweeps:
                self.sweep(self.sweeps.pop(0))

    # -- the messages ----------------------------------------------------------------------------------
    def submit(self, m: wire.Submit) -> None:
        """A request; a resumed one (`m.resume`, serving/host/recovery.py) cooks its prompt and the
        tokens a previous process streamed as its prompt, its generator past their draws."""
        engine = self.engine
        try:
            prompt = encode_prompts([m.prompt], engine.codec)[0] + list(m.resume) if m.resume else m.prompt
            rid = engine.submit(prompt, m.max_new_tokens, **m.settings)
        except EngineError as err:
            self.send_msg(wire.Refusal(m.key, one_line(err)))
            return
        seq = engine.serving.seqs[rid]
        if m.resume and not seq.params.greedy:
            skip_draws(seq.generator, len(m.resume), engine.cfg.vocab_size)
        if self.poison is not None and isinstance(m.prompt, str) and self.poison.word in m.prompt:
            self.poisoned.add(rid)
        self.key_of[rid], self.id_of[m.key], self.arrived[m.key] = m.key, rid, time.perf_counter()
        self.send_msg(wire.Accepted(m.key, len(self.engine.serving.seqs[rid].prompt)))

    def check(self, m: wire.Check) -> None:
        """The order's token ids, within this kitchen's limits (the engine's one check of an order)."""
        form = m.form
        try:
            ids = shared_check(self.engine, order_prompts(self.engine, form), form.max_new_tokens, **form.settings)
        except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
            self.send_msg(wire.Refusal(m.key, one_line(err)))
            return
        self.send_msg(wire.Checked(m.key, ids))

    def place_order(self, m: wire.PlaceOrder) -> None:
        try:
            order = RequestGroup(self.engine, m.prompt_ids, m.max_new_tokens, checked=True, resume=m.resume, **m.settings)
        except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
            self.send_msg(wire.Refusal(m.key, one_line(err)))
            return
        self.orders[m.key] = order
        if self.poison is not None and any(self.poison.word in self.engine.decode(p) for p in m.prompt_ids):
            self.poisoned.update(order.rids)
        for rid, table in order.table.items():
            self.key_of[rid] = f"{m.key}/{table}"
            self.arrived[self.key_of[rid]] = time.perf_counter()
        self.send_msg(wire.OrderAccepted(m.key, [len(p) for p in order.prompts]))

    def cancel(self, m: wire.Cancel) -> None:
        waiting = next((w for w in self.sweeps if w.key == m.key), None)
        if waiting is not None:
            self.sweeps.remove(waiting)
            self.send_msg(wire.SweepDone(m.key, False, "the sweep was cancelled before it started"))
        elif m.key in self.orders:
            self.orders[m.key].cancel()
        elif m.key in self.id_of:
            self.engine.cancel(self.id_of[m.key])

    # -- one sweep, between orders --------------------------------------------------------------------
    def sweep(self, m: wire.RunSweep) -> None:
        """Run a Lab sweep to its end; orders that arrive meanwhile wait in `backlog` (one stove)."""
        try:
            if self.sweeps_runner is None:
                raise EngineError("this kitchen runs no Lab sweeps")
            if self.sweep_engine is None:  # the lessons measure the engine's defaults, not the class's scheduling
                settings = EngineSettings(str(self.engine.device), self.engine.settings.dtype, self.engine.settings.quant)
                self.sweep_engine = Engine.load(self.engine_source, settings)
                self.sweep_engine.generate([[1]], max_new_tokens=2, temperature=0.0)  # first-call setup
            emit = lambda record: self.sweep_progress(m.key, record)  # noqa: E731
            self.send_msg(wire.SweepDone(m.key, True, self.sweeps_runner.run(self.sweep_engine, m.experiment, m.settings, emit)))
        except SweepCancelled:
            self.send_msg(wire.SweepDone(m.key, False, "the sweep was cancelled"))
        except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
            self.send_msg(wire.SweepDone(m.key, False, one_line(err)))

    def sweep_progress(self, key: str, record) -> None:
        """A finished point goes up; a Cancel of this sweep (or Stop) ends it here, between points."""
        self.send_msg(wire.SweepProgress(key, record))
        while self.conn.poll(0):
            msg = self.receive()
            if isinstance(msg, wire.Cancel) and msg.key == key:
                raise SweepCancelled
            self.backlog.append(msg)
            if isinstance(msg, wire.Stop):
                raise SweepCancelled

    # -- one step --------------------------------------------------------------------------------------
    def step(self) -> None:
        engine = self.engine
        events = engine.step()
        if self.poisoned and any(isinstance(ev, Token) and ev.request_id in self.poisoned for ev in events):
            self.poison.strike()
        now = time.perf_counter()
        tokens, done, info, order_news = [], [], None, []
        for key, order in list(self.orders.items()):
            taken = order.take(events)
            end = None if not order.done else "cancelled" if order.cancelled else "done"
            if taken or end:
                order_news.append((key, taken, end))
            if end:
                del self.orders[key]
        for ev in events:
            if isinstance(ev, Token):
                key = self.key_of[ev.request_id]
                ttft = now - self.arrived[key] if ev.step == 0 else None
                lp = None if ev.logprob is None else (engine.decode([ev.token_id]), ev.logprob,
                                                       tuple((engine.decode([i]), v) for i, v in ev.top_logprobs))
                tokens.append((key, ev.token_id, ev.text, ev.step, ev.finished, ttft, lp))
            elif isinstance(ev, Done):
                key = self.key_of.pop(ev.request_id)
                self.id_of.pop(key, None)
                self.arrived.pop(key, None)
                done.append((key, ev.result))
            elif isinstance(ev, StepEnd):
                rec = ev.step
                keys = tuple(self.key_of[r] for r in ev.request_ids if r in self.key_of)
                info = StepInfo(rec.index, rec.phase, rec.seconds, rec.batch, ev.prefill_tokens,
                                ev.decode_tokens, rec.kv_bytes, keys, time.time())  # fmt: skip
        if info is not None or done or order_news:
            state = engine.serving_state()
            queue = QueueState(state.running, state.waiting, state.kv_usage, state.prefix_queries, state.prefix_hits)
            self.held.append(StepNews(info, tokens, done, queue, order_news))
        # Every step goes out at once while a request streams to a client; while only the Kitchen's
        # orders cook (their pages read every 250 ms) the steps go out together every BATCH_S, so
        # the host's process is woken 20 times a second, not at every step (its cores are the
        # browser's: docs/benchmarks/ui-overhead.md).
        only_orders = len(self.key_of) == sum(len(o.rids) for o in self.orders.values())
        # A test's slow engine (`hang_s`) tells its step at once, then stays alive and silent past the watchdog's limit.
        if self.held and (self.hang_s or not only_orders or done or engine.idle or now - self.sent_at >= BATCH_S):
            self.send_msg(wire.Steps(self.held))
            self.held, self.sent_at = [], now
        if self.hang_s:
            time.sleep(self.hang_s)


class OrderTrace:
    """The test hook behind TRACE_ENV: from the first order's question (a Check, or its PlaceOrder)
    to the first forward pass, the project files this process enters, in order, and the call stack
    at the pass, written as JSON to the file the variable names (tests/test_cook_path.py)."""

    FORWARDS = {("engine/native.py", "run"), ("engine/model.py", "forward")}

    def __init__(self, path: str):
        self.path, self.entered, self.done = path, [], False
        self.root = Path(__file__).resolve().parents[2]  # the folder holding the project's packages
        self.known: dict[str, str | None] = {}

    def start(self) -> None:
        if not self.done:
            sys.setprofile(self.profile)

    def rel(self, filename: str) -> str | None:
        if filename not in self.known:
            try:
                rel = Path(filename).resolve().relative_to(self.root).as_posix()
            except ValueError:
                rel = None
            self.known[filename] = rel if rel and rel.startswith(("engine/", "serving/", "lab/", "kitchen_viz/")) else None
        return self.known[filename]

    def profile(self, frame, event, arg) -> None:
        rel = self.rel(frame.f_code.co_filename) if event == "call" else None
        if rel is None:
            return
        if rel not in self.entered:
            self.entered.append(rel)
        if (rel, frame.f_code.co_name) in self.FORWARDS:
            stack, f = [], frame
            while f is not None:
                here = self.rel(f.f_code.co_filename)
                if here is not None and here not in stack:
                    stack.insert(0, here)
                f = f.f_back
            sys.setprofile(None)
            self.done = True
            Path(self.path).write_text(json.dumps({"entered": self.entered, "stack": stack}))


if __name__ == "__main__":
    sys.exit("the loop is started by its host (serving/host/process.py), not as a program")
