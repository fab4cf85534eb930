"""Lab sweeps are a job kind of the kitchen loop: run between orders, in the kitchen's one engine
process, never beside an order (one stove), cancelled between points.

The loop is the real one on the embedded chef; the sweeps are stand-ins defined here (the loop
imports them by name, as it imports an experiment's run function)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from serving.engine_client import EngineClient
from serving.loop_messages import LoopSettings

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


async def until_end(handle, timeout_s: float = 60) -> list:
    items = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        item = await asyncio.wait_for(handle.__anext__(), deadline - time.monotonic())
        items.append(item)
        if item[0] in ("done", "error"):
            return items
    raise AssertionError(items[-3:])


async def drained(handle, timeout_s: float = 120) -> list:
    items, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items += handle.drain()
        if items and items[-1][0] in ("done", "error", "cancelled"):
            return items
        await asyncio.sleep(0.02)
    raise AssertionError(items[-3:])


@pytest.fixture(scope="module")
def client():
    c = EngineClient(LoopSettings("chef", threads=1, token_budget=64))
    yield c
    c.close()


def test_a_sweep_waits_for_the_order_in_flight_and_runs_in_the_kitchens_one_process(client):
    async def go():
        order = await client.submit_order(["ROMEO:"] * 2, 48, {"temperature": 0.0})
        sweep = await client.run_sweep(where_it_ran, {"n": 3})
        order_items = await drained(order)
        order_done_at = time.time()
        return order_items, order_done_at, await until_end(sweep)

    order_items, order_done_at, sweep_items = asyncio.run(go())
    assert order_items[-1][0] == "done"
    (kind, (label, pid, started)), (end, (settings, text)) = sweep_items
    assert kind == "progress" and label == "ran in" and pid == client.pid  # no second engine process
    assert started >= order_done_at - 0.2  # after the order, not beside it (the drain polls every 20 ms)
    assert end == "done" and settings == {"n": 3} and text


def test_an_order_placed_during_a_sweep_waits_for_it_and_a_cancelled_sweep_ends_between_points(client):
    async def go():
        sweep = await client.run_sweep(points_forever, None)
        first = await asyncio.wait_for(sweep.__anext__(), 120)  # it runs
        order_task = asyncio.ensure_future(client.submit_order(["ROMEO:"], 4, {"temperature": 0.0}))
        await asyncio.sleep(0.5)
        waiting = not order_task.done()  # not even accepted: the loop is in the sweep
        client.cancel(sweep.key)
        rest = await until_end(sweep)
        order = await asyncio.wait_for(order_task, 60)
        return first, waiting, rest, await drained(order)

    first, waiting, rest, order_items = asyncio.run(go())
    assert first == ("progress", 0) and waiting
    assert rest[-1] == ("error", "the sweep was cancelled") and all(k == "progress" for k, _ in rest[:-1])
    assert order_items[-1][0] == "done" and client.restarts == 0  # the kitchen goes on


def test_a_failing_sweep_is_one_line_and_the_kitchen_goes_on(client):
    async def go():
        return await until_end(await client.run_sweep(fails, 1))

    [(kind, line)] = asyncio.run(go())
    assert kind == "error" and line == "prompt 9999 tokens; the model's context is 512"


def fails(engine, settings, emit):
    raise ValueError("prompt 9999 tokens;\n the model's context is 512")
