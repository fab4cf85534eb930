"""A hung engine child (alive, silent) is stopped after its silence limit, in one line, and replaced.

Every child here is a real engine process (the embedded chef or apprentice) that is made to hang
for real: either a top-level function that sleeps inside the child, or the child's test hook
(`TWO_POT_TEST_HANG_S`) that makes it go silent right after an order's first event.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.errors import EngineError
from engine.events import PrefillStart
from kitchen_viz.orders import Order, cook
from serving.engine_process import EngineProcess
from serving.service import KitchenService
from serving.watchdog import SILENCE_ENV, TEST_HANG_ENV, Silence, pass_tokens

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
APP = str(Path(__file__).resolve().parent.parent / "app.py")
WAIT_S = 120


def sleep_in_child(engine, seconds: float, *, emit):
    emit("sleeping")
    time.sleep(seconds)
    return "woke"


def test_the_silence_limit_is_a_floor_or_a_multiple_of_the_measured_token_time():
    quick = Silence()
    assert quick.limit_s("stream", ([[1] * 32],), {"max_new_tokens": 128}, token_s=0.0033) == 60.0
    # a big prompt pass on a slow model: 100 x 0.05 s x (8 x 500 tokens) = 20,000 s
    assert quick.limit_s("stream", ([[1] * 500] * 8,), {}, token_s=0.05) == pytest.approx(20_000)
    assert quick.limit_s("run", (sleep_in_child, 3), {}, token_s=1.0) == 600.0
    assert pass_tokens("generate", (["ROMEO:", "JULIET:"],), {"max_new_tokens": 10}) == 6 + 7 + 2 * 10
    assert pass_tokens("generate", (["ROMEO:"],), {}) == 6 + 64  # Engine.generate's default


def test_a_silent_child_is_stopped_after_its_limit_and_restart_brings_it_back():
    p = EngineProcess("chef", "cpu", "float32", threads=1, silence=Silence(floor_s=2, run_s=2))
    try:
        seen = []
        t0 = time.perf_counter()
        with pytest.raises(EngineError, match="sent nothing for 2 s") as err:
            p.proxy.run(sleep_in_child, 60, emit=seen.append)
        assert time.perf_counter() - t0 < 20 and seen == ["sleeping"]
        assert "\n" not in str(err.value) and "hung" in str(err.value) and not p.alive
        p.restart()
        assert p.alive and p.proxy.generate(["ROMEO:"], max_new_tokens=2).tokens
    finally:
        p.close()


def test_an_order_whose_engine_hangs_mid_stream_fails_in_one_line_and_the_kitchen_recovers(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "2")
    monkeypatch.setenv(TEST_HANG_ENV, "60")  # the first child goes silent after each order's first event
    svc = KitchenService("chef", "cpu", "float32", threads=1)
    try:
        assert svc.wait_ready(WAIT_S) and svc.state == "ready"
        first_pid = svc.engine_pid
        monkeypatch.delenv(TEST_HANG_ENV)  # the replacement child behaves
        order = Order(batch=1, max_new_tokens=4, temperature=0.0, seed=0, text="ROMEO:")
        job = svc.submit(cook(order), "hangs")
        assert job.wait(WAIT_S) and job.status == "error"
        assert isinstance(job.events[0], PrefillStart)  # it did start: alive, then silent
        limit = limit_named(job.error)  # 2 s, or more if 100 one-token times of this prompt add up to more
        assert limit >= 2 and job.finished_at - job.started_at >= limit - 0.5 and "\n" not in job.error
        after = svc.submit(cook(order), "after the hang")
        assert after.wait(WAIT_S) and after.status == "done", after.error
        assert svc.engine_pid != first_pid and len(after.result.tokens[0]) == 4
    finally:
        svc.close()


def test_the_page_shows_one_line_naming_the_limit_and_the_next_cook_works(monkeypatch):
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
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert limit_named(errors[0]) >= 3 and "hung" in errors[0] and "restarts it" in errors[0]
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


def wedge_the_gil(engine, *, emit):
    """Hold the child's GIL inside one C call that never returns: a regex that backtracks forever.
    Nothing in the child can run Python now, so its quick-question thread cannot answer either."""
    import re as regex

    emit("wedging")
    return regex.match(r"(a+)+$", "a" * 64 + "b")


def test_a_quick_question_to_a_wedged_child_times_out_in_one_line_and_restart_answers():
    p = EngineProcess("chef", "cpu", "float32", threads=1, silence=Silence(floor_s=60, quick_s=2))
    job_errors: list[EngineError] = []
    started = threading.Event()

    def cook_the_wedge() -> None:
        try:
            p.proxy.run(wedge_the_gil, emit=lambda _: started.set())
        except EngineError as err:
            job_errors.append(err)

    worker = threading.Thread(target=cook_the_wedge)
    try:
        worker.start()
        assert started.wait(WAIT_S), "the wedging job never started"
        time.sleep(0.5)  # the child is inside the regex now
        t0 = time.perf_counter()
        with pytest.raises(
            EngineError, match=r"sent no answer to `encode` for 2 s \(the limit for a quick"
        ) as err:
            p.proxy.encode("ROMEO:")
        assert time.perf_counter() - t0 < 20 and "\n" not in str(err.value) and not p.alive
        worker.join(WAIT_S)
        assert not worker.is_alive() and job_errors, "the job in the killed child ended in one line too"
        p.restart()
        assert p.proxy.encode("ROMEO:") and p.proxy.generate(["ROMEO:"], max_new_tokens=2).tokens
    finally:
        p.close()
