"""The shared kitchen: one engine in one worker thread, jobs taking turns, errors as one line.

Everything here runs the real engine on the embedded chef model; the only "work" functions that
are not generations are ones that wait on an event, to hold the worker busy at a known moment.
"""

from __future__ import annotations

import threading
import time

import pytest

from engine.errors import EngineError
from engine.events import Done, PrefillEnd, PrefillStart, StepEnd, Token
from kitchen_viz.orders import Order, cook
from lab.runlog import RunLog
from serving.service import KitchenService

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
WAIT_S = 120


@pytest.fixture(scope="module")
def kitchen():
    svc = KitchenService("chef", "cpu", "float32", run_log=RunLog())
    assert svc.wait_ready(WAIT_S), "the chef did not load in time"
    yield svc
    svc.close()


def hold_until(gate: threading.Event):
    """A job that keeps the worker busy until the test opens the gate."""

    def work(engine, emit):
        emit("holding")
        gate.wait(WAIT_S)
        return "released"

    return work


def test_loads_the_chef_and_says_what_it_loaded():
    svc = KitchenService("chef", "cpu", "float32")
    try:
        assert "MB of chef on cpu" in svc.loading_message
        assert svc.weights_mb and 1 < svc.weights_mb < 40
        assert svc.wait_ready(WAIT_S)
        assert svc.state == "ready" and svc.load_s > 0
        assert svc.info.name == "chef" and svc.info.max_context > 0
    finally:
        svc.close()


def test_cook_streams_engine_events_and_returns_the_result(kitchen):
    order = Order(batch=2, max_new_tokens=6, temperature=0.0, seed=0, prompt_tokens=12)
    job = kitchen.submit(cook(order), order.label)
    assert job.wait(WAIT_S)
    assert job.status == "done", job.error
    kinds = [type(e) for e in job.events]
    assert kinds[0] is PrefillStart and kinds[1] is PrefillEnd and kinds[-1] is Done
    assert kinds.count(Token) == 2 * 6 and StepEnd in kinds
    res = job.result
    assert len(res.texts) == 2 and all(len(t) == 6 for t in res.tokens)
    assert res.metrics.ttft_s > 0 and res.metrics.tpot_s > 0
    assert job.queue_wait_s >= 0 and job.place_in_line() == 0


def test_generated_prompts_have_the_requested_length(kitchen):
    order = Order(batch=3, max_new_tokens=2, temperature=0.0, seed=0, prompt_tokens=40)
    job = kitchen.submit(cook(order), order.label)
    assert job.wait(WAIT_S) and job.status == "done", job.error
    assert job.events[0].prompt_tokens == [40, 40, 40]


def test_jobs_take_turns_and_know_their_place_in_line(kitchen):
    gate = threading.Event()
    first = kitchen.submit(hold_until(gate), "hold")
    order = Order(batch=1, max_new_tokens=3, temperature=0.0, seed=0, text="ROMEO:")
    second = kitchen.submit(cook(order), "second")
    third = kitchen.submit(cook(order), "third")
    try:
        for _ in range(200):  # the worker picks the first job up and starts it
            if first.status == "running" and first.events:
                break
            threading.Event().wait(0.05)
        assert first.status == "running" and first.events == ["holding"]
        assert second.status == "queued" and second.place_in_line() == 1
        assert third.place_in_line() == 2
        assert kitchen.queue_length() == 3
    finally:
        gate.set()
    assert third.wait(WAIT_S)
    assert [j.status for j in (first, second, third)] == ["done", "done", "done"]
    assert first.result == "released"
    assert second.started_at <= third.started_at
    assert second.queue_wait_s > 0 and second.result.texts == third.result.texts  # same order, greedy


def test_a_refused_order_is_one_line_and_the_kitchen_keeps_working(kitchen):
    too_long = Order(batch=1, max_new_tokens=10_000, temperature=0.0, seed=0, text="ROMEO:")
    job = kitchen.submit(cook(too_long), "too long")
    assert job.wait(WAIT_S)
    assert job.status == "error" and "context" in job.error and "\n" not in job.error
    ok = kitchen.submit(cook(Order(batch=1, max_new_tokens=2, temperature=0.0, seed=0, text="ROMEO:")), "ok")
    assert ok.wait(WAIT_S) and ok.status == "done"


def test_a_crashing_job_becomes_a_line_not_a_dead_worker(kitchen):
    def broken(engine, emit):
        raise RuntimeError("the ladle\nbroke")

    job = kitchen.submit(broken, "broken")
    assert job.wait(WAIT_S)
    assert job.status == "error" and job.error == "RuntimeError: the ladle broke"
    ok = kitchen.submit(cook(Order(batch=1, max_new_tokens=2, temperature=0.0, seed=0, text="A")), "after")
    assert ok.wait(WAIT_S) and ok.status == "done"


def test_every_finished_generation_lands_in_the_run_log(kitchen):
    before = len(kitchen.run_log)
    job = kitchen.submit(
        cook(Order(batch=1, max_new_tokens=3, temperature=0.0, seed=0, text="JULIET:")), "log"
    )
    assert job.wait(WAIT_S) and job.status == "done"
    frame = kitchen.run_log.frame()
    assert len(kitchen.run_log) == before + 1 and frame.iloc[-1]["model"] == "chef"


def test_quick_questions_use_the_engines_own_limits(kitchen):
    lim = kitchen.limits(10, 20)
    assert lim.max_context == kitchen.info.max_context and lim.max_batch >= 1
    assert kitchen.check(["ROMEO:"], 4)[0] == kitchen.encode("ROMEO:")
    with pytest.raises(EngineError, match="empty"):
        kitchen.check([""], 4)


def test_an_unknown_model_fails_to_load_with_one_line():
    svc = KitchenService("no-such-model", "cpu", "float32")
    try:
        assert svc.wait_ready(WAIT_S)
        assert svc.state == "error" and "no-such-model" in svc.load_error and "\n" not in svc.load_error
        job = svc.submit(lambda eng, emit: None, "never runs")
        assert job.wait(WAIT_S) and job.status == "error" and job.error == svc.load_error
    finally:
        svc.close()


def test_a_closed_kitchen_refuses_new_orders():
    svc = KitchenService("chef", "cpu", "float32")
    svc.close()
    with pytest.raises(EngineError, match="closed"):
        svc.submit(lambda eng, emit: None, "late")


def test_a_held_order_waits_for_its_page_to_release_it(kitchen):
    order = Order(batch=1, max_new_tokens=2, temperature=0.0, seed=0, text="ROMEO:")
    job = kitchen.submit(cook(order), "held", hold=True)
    assert not job.wait(0.5) and not job.events  # the worker has it, but waits for the page
    job.release()
    assert job.wait(WAIT_S) and job.status == "done" and job.result.texts


def test_a_release_can_ask_for_time_for_the_browser_to_settle(kitchen):
    from serving.service import SETTLE_S

    job = kitchen.submit(lambda eng, emit: emit(time.perf_counter()), "settles", hold=True)
    released = time.perf_counter()
    job.release(settle_s=SETTLE_S)
    assert job.wait(WAIT_S) and job.status == "done"
    assert job.events[0] - released >= SETTLE_S
    quick = kitchen.submit(lambda eng, emit: emit(time.perf_counter()), "released at once", hold=True)
    released = time.perf_counter()
    quick.release()
    assert quick.wait(WAIT_S) and quick.events[0] - released < SETTLE_S


def test_the_app_leaves_one_core_to_the_page_unless_told_otherwise(monkeypatch):
    import os

    from serving.service import engine_threads

    monkeypatch.delenv("TWO_POT_THREADS", raising=False)
    assert engine_threads() == max(1, (os.cpu_count() or 2) - 1)
    monkeypatch.setenv("TWO_POT_THREADS", "3")
    assert engine_threads() == 3


def test_a_child_gone_between_orders_is_replaced_before_the_form_asks_it_anything():
    """Killed while idle (the OS, or a quick question that found it hung): the next question says so
    in one line and starts a fresh child; the page sees "loading", then a working kitchen."""
    import os
    import signal

    svc = KitchenService("chef", "cpu", "float32")
    try:
        assert svc.wait_ready(WAIT_S)
        old = svc.engine_pid
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while svc._process.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(EngineError, match="had stopped; it is loading again") as err:
            svc.limits(1, 8)
        assert "\n" not in str(err.value) and svc.state == "loading"
        assert svc.revive_if_dead() is False  # one restart, not one per question
        assert svc.wait_ready(WAIT_S) and svc.state == "ready"
        assert svc.engine_pid != old and svc.limits(1, 8).max_batch >= 1
        order = Order(batch=1, max_new_tokens=3, temperature=0.0, seed=0, prompt_tokens=4)
        job = svc.submit(cook(order), order.label)
        assert job.wait(WAIT_S) and job.status == "done", job.error
    finally:
        svc.close()
