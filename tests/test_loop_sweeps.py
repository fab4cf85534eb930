"""Lab sweeps are a job kind of the host's loop: run between orders, in the kitchen's one engine
process, never beside an order (one stove), cancelled between points.

The loop is the real one on the embedded chef; the sweeps are stand-ins defined here, run by key
through the sweeps object the host was started with (as the Lab's registry is, lab/sweeps.py)."""

from __future__ import annotations

import os
import time

import pytest

from engine.events import Done
from engine.settings import EngineSettings
from serving.host.api import CheckedOrder, OrderForm
from serving.host.loop import LoopSettings
from serving.host.process import EngineProcess

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def where_it_ran(engine, settings, emit):
    """Reports the process it ran in, what it was handed, and a real generation on its engine."""
    emit(("ran in", os.getpid(), time.time()))
    return settings, engine.generate(["ROMEO:"], max_new_tokens=3, temperature=0.0).texts[0]


def points_forever(engine, settings, emit):
    for i in range(10_000):
        time.sleep(0.05)
        emit(i)
    return "never"


def fails(engine, settings, emit):
    raise ValueError("prompt 9999 tokens;\n the model's context is 512")


class StandIns:
    """The sweeps this test's host runs, by key (the Lab's are lab/sweeps.py `LabSweeps`)."""

    runs = {"where": where_it_ran, "forever": points_forever, "fails": fails}
    keys = tuple(runs)

    def check(self, key, settings) -> None:
        pass

    def run(self, engine, key, settings, emit):
        return self.runs[key](engine, settings, emit)


def drained(handle, timeout_s: float = 120) -> list:
    items, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items += handle.drain()
        if items and items[-1][0] in ("done", "error", "cancelled"):
            return items
        time.sleep(0.02)
    raise AssertionError(items[-3:])


@pytest.fixture(scope="module")
def process():
    p = EngineProcess(LoopSettings("chef", EngineSettings(policy="chunked", token_budget=64), threads=1),
                      sweeps=StandIns())  # fmt: skip
    yield p
    p.close()


def order(process: EngineProcess, prompts: list, max_new: int):
    ids = process.check(OrderForm(prompts, max_new, {"temperature": 0.0})).result(60)
    return process.place_order(CheckedOrder(ids, max_new, {"temperature": 0.0}))


def test_a_sweep_waits_for_the_order_in_flight_and_runs_in_the_kitchens_one_process(process):
    placed_at = time.time()
    placed = order(process, ["ROMEO:"] * 2, 48)
    sweep = process.run_sweep("where", {"n": 3})
    order_items = drained(placed)
    sweep_items = drained(sweep)
    assert order_items[-1][0] == "done"
    (kind, (label, pid, started)), (end, (settings, text)) = sweep_items
    assert kind == "progress" and label == "ran in" and pid == process.pid  # no second engine process
    # After the order, not beside it, on the one clock both processes read: the order cannot have
    # finished before it was placed plus its own E2E, so a sweep that waited starts after that however
    # slow the machine (this side's polling, which a busy machine delays, plays no part).
    e2e_s = max(ev.result.metrics.e2e_s for kind, evs in order_items if kind == "events" for ev in evs
                if isinstance(ev, Done))  # fmt: skip
    assert started >= placed_at + e2e_s, (started - placed_at, e2e_s)
    assert end == "done" and settings == {"n": 3} and text


def test_an_order_placed_during_a_sweep_waits_for_it_and_a_cancelled_sweep_ends_between_points(process):
    sweep = process.run_sweep("forever", None)
    deadline = time.monotonic() + 120
    first = []
    while not first and time.monotonic() < deadline:  # it runs
        first = sweep.drain()
        time.sleep(0.02)
    checking = process.check(OrderForm(["ROMEO:"], 4, {"temperature": 0.0}))
    time.sleep(0.5)
    waiting = not checking.done()  # not even answered: the loop is in the sweep
    process.cancel(sweep.key)
    rest = drained(sweep)
    ids = checking.result(60)
    placed = process.place_order(CheckedOrder(ids, 4, {"temperature": 0.0}))
    assert first[0] == ("progress", 0) and waiting
    assert rest[-1] == ("error", "the sweep was cancelled") and all(k == "progress" for k, _ in rest[:-1])
    assert drained(placed)[-1][0] == "done" and process.restarts == 0  # the kitchen goes on


def test_a_failing_sweep_is_one_line_and_the_kitchen_goes_on(process):
    [(kind, line)] = drained(process.run_sweep("fails", 1))
    assert kind == "error" and line == "prompt 9999 tokens; the model's context is 512"
