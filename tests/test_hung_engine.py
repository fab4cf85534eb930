"""A hung engine (alive, silent) is stopped after its silence limit and replaced; a dead one is
replaced too. The order it was cooking goes on in the fresh one (its events carry a `Restart` that
names why, in one line); a question asked of the stuck engine fails in one line. On the Kitchen's own kitchen host, as the app runs it (tests/own_kitchen.py):
the engine's kitchen loop is made to hang for real by its test hook (`TWO_POT_TEST_HANG_S`: a pause
after every step, once that step's events are sent) or killed for real. The watchdog's rule itself
is tested on the loop's client (tests/test_loop_watchdog.py).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from own_kitchen import own_kitchen, process_of, wait_for
from streamlit.testing.v1 import AppTest

from engine.errors import EngineError
from engine.events import PrefillStart, Restart
from kitchen_viz.orders import Order
from serving.host.api import OrderForm
from serving.host.loop import TEST_HANG_ENV
from serving.host.watchdog import SILENCE_ENV

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
APP = str(Path(__file__).resolve().parent.parent / "kitchen_viz" / "web" / "app.py")
WAIT_S = 120
ORDER = Order(batch=1, max_new_tokens=4, temperature=0.0, seed=0, text="ROMEO:")
LONG = Order(batch=2, max_new_tokens=400, temperature=0.0, seed=0, prompt_tokens=16)


def restart_of(job) -> Restart:
    (mark,) = [e for e in job.events if isinstance(e, Restart)]
    assert "\n" not in mark.why, mark.why
    return mark


def test_an_order_whose_engine_hangs_mid_stream_goes_on_in_the_fresh_one(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "6")  # the first step (a fresh engine's seats, a loaded machine) fits in it
    monkeypatch.setenv(TEST_HANG_ENV, "60")  # the first loop goes silent after each step's events
    with own_kitchen("chef") as (svc, kitchens):
        client = process_of(kitchens)
        first_pid = client.pid
        monkeypatch.delenv(TEST_HANG_ENV)  # the replacement loop behaves
        job = svc.submit(svc.check(ORDER.form()), "hangs")
        assert job.wait(WAIT_S) and job.status == "done", job.error
        assert isinstance(job.events[0], PrefillStart)  # it did start: alive, then silent
        why = restart_of(job).why
        limit = limit_named(why)  # 6 s, or 20 x its longest step if that is longer
        assert limit >= 6 and job.finished_at - job.started_at >= limit - 0.5
        assert "hung" in why and "restarts it" in why
        assert client.pid != first_pid and len(job.result.tokens[0]) == 4


def test_a_quick_question_to_a_hung_engine_fails_in_one_line_and_the_fresh_one_answers(monkeypatch):
    """The order form's questions are answered between two steps: one asked of a loop stuck in a
    step waits at most the silence limit, then fails in one line, and the next one is answered."""
    monkeypatch.setenv(SILENCE_ENV, "5")  # time to ask while the loop is stuck, before it is stopped
    monkeypatch.setenv(TEST_HANG_ENV, "60")
    with own_kitchen("chef") as (svc, kitchens):
        monkeypatch.delenv(TEST_HANG_ENV)
        job = svc.submit(svc.check(LONG.form()), "keeps the loop in a step")
        assert wait_for(lambda: job.events), job.error
        t0 = time.perf_counter()
        with pytest.raises(EngineError, match="hung") as err:  # the one question an order asks the engine
            svc.check(OrderForm(["ROMEO, asked while the loop is stuck:"], 8))
        assert time.perf_counter() - t0 < 30 and "\n" not in str(err.value) and limit_named(str(err.value)) >= 5
        assert svc.limits(1, 8).max_batch >= 1  # what one order may ask is the host's arithmetic: no engine needed
        assert job.wait(WAIT_S) and job.status == "done", job.error  # the order in the stopped loop went on
        assert "hung" in restart_of(job).why and all(0 < len(t) <= 400 for t in job.result.tokens)
        assert svc.check(OrderForm(["ROMEO:"], 8)).prompt_ids and process_of(kitchens).restarts == 1


def test_the_kitchen_restarts_an_engine_that_died_mid_order():
    with own_kitchen("chef") as (svc, kitchens):
        client = process_of(kitchens)
        first_pid = client.pid
        job = svc.submit(svc.check(LONG.form()), "cooking when the engine dies")
        assert wait_for(lambda: job.events), job.error
        os.kill(first_pid, signal.SIGKILL)
        assert job.wait(WAIT_S) and job.status == "done", job.error  # it went on in the fresh process
        assert "engine process for chef stopped" in restart_of(job).why
        assert all(0 < len(t) <= 400 for t in job.result.tokens)
        after = svc.submit(svc.check(ORDER.form()), "after the crash")
        assert after.wait(WAIT_S) and after.status == "done", after.error
        assert client.pid != first_pid and len(after.result.tokens[0]) == 4


def test_the_page_cooks_through_a_hang_and_the_next_cook_works(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "3")
    monkeypatch.setenv(TEST_HANG_ENV, "60")
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["tpk_model"] = "apprentice"  # a kitchen of its own: no other page test shares it
    at.run()
    wait_for_cook_button(at)
    monkeypatch.delenv(TEST_HANG_ENV)  # only the child already running hangs
    monkeypatch.delenv(SILENCE_ENV)
    at.toggle(key="tpk_live").set_value(True).run()  # return at once; the test waits on the job
    at.slider(key="tpk_new").set_value(4).run()
    next(b for b in at.button if "Cook" in b.label).click().run()
    assert at.session_state["tpk_job"].wait(WAIT_S)
    at.run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]  # no error: the order went on in the fresh engine
    job = at.session_state["tpk_job"]
    assert job.status == "done" and limit_named(restart_of(job).why) >= 3 and at.session_state["tpk_result"]["texts"][0]
    wait_for_cook_button(at)  # the fresh child has loaded
    next(b for b in at.button if "Cook" in b.label).click().run()
    assert at.session_state["tpk_job"].wait(WAIT_S)
    at.run()
    assert not at.exception and not at.error
    assert at.session_state["tpk_result"]["texts"][0]


def limit_named(line: str) -> int:
    """The limit a hung-engine line names: '... sent nothing for 12 s (the limit ...' -> 12."""
    found = re.search(r"sent nothing for ([\d,]+) s \(the limit", line)
    assert found, line
    return int(found.group(1).replace(",", ""))


def wait_for_cook_button(at: AppTest) -> None:
    deadline = time.monotonic() + WAIT_S
    while not any("Cook" in b.label for b in at.button) and time.monotonic() < deadline:
        assert not at.exception, at.exception
        time.sleep(0.3)
        at.run()
    assert any("Cook" in b.label for b in at.button)
