"""The class kitchen's engine process: one Engine, one step loop, every student's order in it.

The kitchen host (serving/server.py) never touches torch: it starts this loop as a child process
and talks to it over one pipe (serving/engine_client.py). The loop owns the Engine (an Engine is
not thread-safe), so every submit and cancel is a message it applies between two steps, and every
step's events go back as one message. Orders from different students join the same running batch
at the next step. The messages are serving/loop_messages.py's dataclasses, one JSON object each
on the pipe (its `encode` / `decode`); `Loop.handlers` is the one table that dispatches them.

Run as `python -c ENTRY_CODE FD SETTINGS_JSON` (LoopSettings as JSON; serving/engine_client.py
does this). The code pins the process to its cores before it imports torch, so every thread torch
starts inherits them.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from dataclasses import asdict
from multiprocessing.connection import Connection

import torch

from engine import Engine, EngineError
from engine.events import Done, StepEnd, Token
from engine.quant import precision_parts
from engine.request_group import RequestGroup, shared_check, shared_limits
from serving import loop_messages as msgs
from serving.loop_messages import TEST_HANG_ENV, LoopSettings, QueueState, ReadyInfo, StepInfo
from serving.order_wire import to_wire

__all__ = ["ENTRY_CODE", "LoopSettings", "QueueState", "ReadyInfo", "StepInfo", "entry"]

ENTRY_CODE = ("import json, os, sys; cores = json.loads(sys.argv[2]).get('cores'); "
              "cores and os.sched_setaffinity(0, set(cores)); "
              "from serving.kitchen_loop import entry; entry(sys.argv[1:])")  # fmt: skip
IDLE_POLL_S = 1.0  # an idle loop wakes this often to notice a parent that went away
BATCH_S = 0.05  # while only Kitchen orders cook, their steps go to the server together this often


def entry(argv: list[str]) -> None:
    fd, settings = argv
    s = json.loads(settings)
    s["cores"] = tuple(s.get("cores", ()))
    conn = Connection(int(fd))
    engine = load(conn, LoopSettings(**s))
    if engine is not None:
        Loop(conn, engine, s["model"]).run()


def load(conn, s: LoopSettings) -> Engine | None:
    """Load and warm up the engine, then say Ready; or say LoadError (one line) and return None."""
    t0 = time.perf_counter()
    try:
        if s.threads:
            torch.set_num_threads(s.threads)
        dtype, quant = precision_parts(s.dtype)  # `--dtype int8`: int8 matrices, float32 for the rest
        engine = Engine.load(s.model, s.device, dtype, policy=s.policy, token_budget=s.token_budget,
                             max_seqs=s.max_seqs, max_seq_len=s.max_seq_len, prefix_cache=s.prefix_cache,
                             quant=quant, batch_invariant=s.batch_invariant)  # fmt: skip
        engine.submit([1], 2)  # first-call setup stays out of the first student's TTFT
        while not engine.idle:
            engine.step()
    except Exception as err:  # noqa: BLE001 -- the parent gets one line, whatever went wrong
        conn.send_bytes(msgs.encode(msgs.LoadError(" ".join(f"could not load {s.model}: {err}".split()))))
        return None
    codec = engine.codec
    lim = engine.serving_limits()
    conn.send_bytes(msgs.encode(msgs.Ready(ReadyInfo(
        engine.info.name, str(engine.device), engine.info.precision, s.policy, engine.cfg.max_context,
        engine.cfg.vocab_size, lim.seats, lim.kv_tokens, getattr(codec, "chat_template", None),
        getattr(codec, "bos_token", ""), getattr(codec, "eos_token", ""), time.perf_counter() - t0,
        asdict(engine.info), s.token_budget, s.batch_invariant,
    ))))  # fmt: skip
    return engine


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


class SweepCancelled(Exception):
    """The sweep's client went away (or the loop stops): the sweep ends at its next point."""


class Loop:
    """The step loop and what it remembers between steps: which key each engine request has."""

    def __init__(self, conn, engine: Engine, source: str = ""):
        self.conn, self.engine = conn, engine
        self.engine_source = source  # what the engine was loaded from: a sweep's engine loads it too
        self.key_of: dict[int, str] = {}  # engine request id -> the host's key ("r3", "o1/0")
        self.id_of: dict[str, int] = {}
        self.arrived: dict[str, float] = {}
        self.orders: dict[str, RequestGroup] = {}
        self.held: list[tuple] = []  # steps not yet sent (see BATCH_S)
        self.sent_at = time.perf_counter()
        self.hang_s = float(os.environ.get(TEST_HANG_ENV) or 0)
        self.sweeps: list[msgs.RunSweep] = []  # waiting for the engine to be idle
        self.backlog: list = []  # messages that arrived while a sweep ran
        self.sweep_engine: Engine | None = None
        self.handlers = {msgs.Submit: self.submit, msgs.PlaceOrder: self.place_order, msgs.Ask: self.ask,
                         msgs.RunSweep: self.sweeps.append, msgs.Cancel: self.cancel}  # fmt: skip

    def send_msg(self, msg) -> None:
        self.conn.send_bytes(msgs.encode(msg))

    def recv_msg(self):
        return msgs.decode(self.conn.recv_bytes())

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
                    msg = self.backlog.pop(0) if self.backlog else self.recv_msg()
                except (EOFError, OSError):
                    return
                if isinstance(msg, msgs.Stop):
                    return
                self.handlers[type(msg)](msg)
            if not engine.idle:
                self.step()
            elif self.sweeps:
                self.sweep(self.sweeps.pop(0))

    # -- the messages ----------------------------------------------------------------------------------
    def submit(self, m: msgs.Submit) -> None:
        try:
            rid = self.engine.submit(m.prompt, m.max_new_tokens, **m.settings)
        except EngineError as err:
            self.send_msg(msgs.Refusal(m.key, str(err)))
            return
        self.key_of[rid], self.id_of[m.key], self.arrived[m.key] = m.key, rid, time.perf_counter()
        self.send_msg(msgs.Accepted(m.key, len(self.engine.serving.seqs[rid].prompt)))

    def place_order(self, m: msgs.PlaceOrder) -> None:
        try:
            order = RequestGroup(self.engine, m.prompts, m.max_new_tokens, **m.settings)
        except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
            self.send_msg(msgs.Refusal(m.key, one_line(err)))
            return
        self.orders[m.key] = order
        for table, rid in enumerate(order.rids):
            self.key_of[rid] = f"{m.key}/{table}"
            self.arrived[self.key_of[rid]] = time.perf_counter()
        self.send_msg(msgs.OrderAccepted(m.key, [len(p) for p in order.prompts]))

    def ask(self, m: msgs.Ask) -> None:
        try:
            if m.question == "limits":
                value = asdict(shared_limits(self.engine, *m.args))
            else:
                prompts, max_new, settings = m.args
                value = shared_check(self.engine, prompts, max_new, **settings)
            self.send_msg(msgs.AskReply(m.key, True, value))
        except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
            self.send_msg(msgs.AskReply(m.key, False, one_line(err)))

    def cancel(self, m: msgs.Cancel) -> None:
        waiting = next((w for w in self.sweeps if w.key == m.key), None)
        if waiting is not None:
            self.sweeps.remove(waiting)
            self.send_msg(msgs.SweepDone(m.key, False, "the sweep was cancelled before it started"))
        elif m.key in self.orders:
            self.orders[m.key].cancel()
        elif m.key in self.id_of:
            self.engine.cancel(self.id_of[m.key])

    # -- one sweep, between orders --------------------------------------------------------------------
    def sweep(self, m: msgs.RunSweep) -> None:
        """Run a Lab sweep to its end; orders that arrive meanwhile wait in `backlog` (one stove)."""
        try:
            sys.path += [p for p in m.path if p not in sys.path]
            run = getattr(importlib.import_module(m.module), m.name)
            if self.sweep_engine is None:
                info = self.engine.info
                dtype, quant = precision_parts(info.precision)
                self.sweep_engine = Engine.load(self.engine_source, str(self.engine.device), dtype, quant=quant)
                self.sweep_engine.generate([[1]], max_new_tokens=2, temperature=0.0)  # first-call setup
            result = run(self.sweep_engine, m.settings, lambda record: self.sweep_progress(m.key, record))
            self.send_msg(msgs.SweepDone(m.key, True, result))
        except SweepCancelled:
            self.send_msg(msgs.SweepDone(m.key, False, "the sweep was cancelled"))
        except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
            self.send_msg(msgs.SweepDone(m.key, False, one_line(err)))

    def sweep_progress(self, key: str, record) -> None:
        """A finished point goes up; a Cancel of this sweep (or Stop) ends it here, between points."""
        self.send_msg(msgs.SweepProgress(key, record))
        while self.conn.poll(0):
            msg = self.recv_msg()
            if isinstance(msg, msgs.Cancel) and msg.key == key:
                raise SweepCancelled
            self.backlog.append(msg)
            if isinstance(msg, msgs.Stop):
                raise SweepCancelled

    # -- one step --------------------------------------------------------------------------------------
    def step(self) -> None:
        engine = self.engine
        events = engine.step()
        now = time.perf_counter()
        tokens, done, info, order_news = [], [], None, []
        for key, order in list(self.orders.items()):
            taken = order.take(events)
            end = None if not order.done else "cancelled" if order.cancelled else "done"
            if taken or end:
                order_news.append((key, [to_wire(e) for e in taken], end))
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
            self.held.append((info, tokens, done, queue, order_news))
        # Every step goes out at once while a request streams to a client; while only the Kitchen's
        # orders cook (their pages read every 250 ms) the steps go out together every BATCH_S, so
        # the server process is woken 20 times a second, not at every step (its cores are the
        # browser's: docs/benchmarks/ui-overhead.md).
        only_orders = len(self.key_of) == sum(len(o.rids) for o in self.orders.values())
        # A test's slow engine (`hang_s`) tells its step at once, then stays alive and silent past the watchdog's limit.
        if self.held and (self.hang_s or not only_orders or done or engine.idle or now - self.sent_at >= BATCH_S):
            self.send_msg(msgs.Steps(self.held))
            self.held, self.sent_at = [], now
        if self.hang_s:
            time.sleep(self.hang_s)


if __name__ == "__main__":
    entry(sys.argv[1:])
