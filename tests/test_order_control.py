"""What ends an order early, and the one stove: caps, time limit, Cancel, a closed page, the stove line.

Everything runs the real engine (the embedded chef) on the Kitchen's own kitchen host, as the app
runs it (tests/own_kitchen.py: a `HostClient` on the app's own `EngineHost`, the engine in its loop
process). Where a test needs the machine busy at a known moment, it holds the stove with a ticket
of another kitchen, as another model's order would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import use_settings
from own_kitchen import nothing_in_flight, own_kitchen, process_of, wait_for

from engine.errors import EngineError
from engine.events import PrefillStart, Token
from kitchen_viz.orders import Order
from serving import job as job_mod
from serving.caps import CapExceeded, Caps, load_caps
from serving.cores import ALL_CORES, split_cores
from serving.device_lock import CoreMeter, DeviceLock, LockTicket
from serving.host.api import OrderForm
from serving.host.loop import TEST_HANG_ENV
from serving.host.watchdog import SILENCE_ENV
from serving.job import PAGE_GONE

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
WAIT_S = 120
# About 2 s at the native step's pace (3.9 ms a step at batch 16, docs/benchmarks/native-cpu.md):
# several times the 0.5 s time cap and a Cancel's round trip, on a CPU faster than this one too
LONG = Order(batch=16, max_new_tokens=480, temperature=0.0, seed=0, prompt_tokens=16)
LONGER = Order(batch=64, max_new_tokens=500, temperature=0.0, seed=0, prompt_tokens=8)  # several seconds


@pytest.fixture(scope="module")
def kitchen():
    with own_kitchen("chef") as (svc, kitchens):
        yield svc, kitchens


@pytest.fixture()
def chef(kitchen):
    return kitchen[0]


def one_line(text: str | None) -> str:
    assert text and "\n" not in text, text
    return text


def assert_kitchen_still_cooks(svc) -> None:
    order = Order(batch=1, max_new_tokens=3, temperature=0.0, seed=0, text="ROMEO:")
    job = svc.submit(svc.check(order.form()), "after")
    assert job.wait(WAIT_S) and job.status == "done", job.error
    assert len(job.result.tokens[0]) == 3


# -- the instructor's caps ---------------------------------------------------------------------------


def test_an_order_over_a_cap_is_refused_in_one_line_naming_the_cap_and_its_value(chef):
    caps = Caps(max_order_tokens=100, max_new_tokens=64, max_order_seconds=30)
    ids = chef.check(Order(batch=4, max_new_tokens=8, temperature=0, seed=0, prompt_tokens=32).form()).prompt_ids
    with pytest.raises(CapExceeded) as err:
        caps.check([len(p) for p in ids], 8)
    msg = one_line(str(err.value))
    assert "128 prompt tokens (4 tables)" in msg and "limit is 100 tokens per order (max_order_tokens)" in msg
    with pytest.raises(CapExceeded) as err:
        caps.check([5], 65)
    msg = one_line(str(err.value))
    assert "65 new tokens" in msg and "limit is 64 new tokens per order (max_new_tokens)" in msg
    caps.check([len(p) for p in ids[:3]], 64)  # 96 tokens, 64 new: inside both caps


def test_caps_come_from_the_instructors_toml_and_bad_files_are_one_line(tmp_path, monkeypatch):
    use_settings(monkeypatch)
    assert load_caps() == Caps()  # the documented defaults
    good = tmp_path / "caps.toml"
    good.write_text("[caps]\nmax_order_tokens = 2048\nmax_order_seconds = 30\n")
    use_settings(monkeypatch, caps=str(good))  # `two-pot-kitchen --caps caps.toml`
    caps = load_caps()
    assert caps == Caps(max_order_tokens=2048, max_new_tokens=Caps().max_new_tokens, max_order_seconds=30.0)
    assert "2,048 prompt tokens" in caps.summary() and "30 s of cooking" in caps.summary()
    for body, expected in [
        ("[caps]\nmax_tokens = 5\n", "unknown cap 'max_tokens'"),
        ("[caps]\nmax_new_tokens = -1\n", "must be a positive number"),
        ("[caps]\nmax_order_tokens = 10.5\n", "must be a whole number"),
        ("max_new_tokens = 5\n", "expected one [caps] table"),
        ("[caps\n", "not valid TOML"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        with pytest.raises(EngineError) as err:
            load_caps(bad)
        assert expected in one_line(str(err.value))


def test_the_app_kitchens_obey_the_instructors_caps_file(tmp_path, monkeypatch):
    """`two-pot-kitchen --caps caps.toml` puts the file in the app's settings; each kitchen of the
    app reads it as it opens, and refuses an order over a cap before it cooks, in one line naming the cap."""
    caps = tmp_path / "caps.toml"
    caps.write_text("[caps]\nmax_new_tokens = 8\nmax_order_tokens = 64\n")
    use_settings(monkeypatch, caps=str(caps))
    with own_kitchen("chef") as (svc, kitchens):
        with pytest.raises(CapExceeded) as err:  # the host's check refuses it: it never becomes a job
            svc.check(Order(batch=1, max_new_tokens=9, temperature=0.0, seed=0, text="ROMEO:").form())
        assert "the instructor's limit is 8 new tokens per order (max_new_tokens)" in one_line(str(err.value))
        big = Order(batch=5, max_new_tokens=4, temperature=0.0, seed=0, prompt_tokens=16)  # 80 prompt tokens
        with pytest.raises(CapExceeded) as err:
            svc.check(big.form())
        assert "limit is 64 tokens per order (max_order_tokens)" in one_line(str(err.value))
        assert_kitchen_still_cooks(svc)
        assert nothing_in_flight(process_of(kitchens))


def test_an_order_past_its_time_is_cancelled_in_one_line_and_the_kitchen_cooks_on(kitchen, monkeypatch):
    chef, kitchens = kitchen
    monkeypatch.setattr(kitchens.host_for("chef", "cpu", "float32"), "caps", Caps(max_order_seconds=0.5))  # the host's cap
    job = chef.submit(chef.check(LONG.form()), "too long")
    assert job.wait(WAIT_S)
    assert job.status == "cancelled"
    assert one_line(job.error) == "cancelled after 0.5 s: the instructor's limit per order is 0.5 s"
    assert 0.5 <= job.finished_at - job.started_at < 0.5 + 5  # stopped at once, not at the order's end
    tokens = sum(isinstance(e, Token) for e in job.events)
    assert 0 < tokens < LONG.batch * LONG.max_new_tokens  # it cooked, and it stopped early
    assert_kitchen_still_cooks(chef)


# -- Cancel ------------------------------------------------------------------------------------------


def test_cancel_stops_a_cooking_order_and_the_engine_takes_the_next(chef):
    pid = chef.engine_pid
    job = chef.submit(chef.check(LONG.form()), "long")
    assert wait_for(lambda: any(isinstance(e, Token) for e in job.events)), job.error
    t0 = time.perf_counter()
    assert job.cancel()
    assert job.wait(10) and job.status == "cancelled"
    assert one_line(job.error) == "cancelled: you pressed Cancel"
    assert job.finished_at - t0 < 5 and sum(isinstance(e, Token) for e in job.events) < LONG.batch * LONG.max_new_tokens
    assert not job.cancel()  # a finished order cannot be cancelled again
    assert_kitchen_still_cooks(chef)
    assert chef.engine_pid == pid  # stopped between two steps: the same engine process cooks on


def test_a_queued_order_leaves_the_line_at_once(chef):
    """Another kitchen holds the machine's stove: the orders wait in its line, in order, and a
    cancelled one leaves it at once, having cooked nothing."""
    other = LockTicket("apprentice: a long order", kitchen="another kitchen")
    assert chef.device_lock.take(other)
    try:
        second = chef.submit(chef.check(LONG.form()), "waits")
        third = chef.submit(chef.check(Order(1, 2, 0.0, 0, text="ROMEO:").form()), "waits behind it")
        assert wait_for(lambda: third.place_in_line() == 2, 30)
        assert second.place_in_line() == 1 and second.status == "queued" and chef.queue_length() == 2
        assert "apprentice: a long order is cooking" in second.waiting_line()
        t0 = time.perf_counter()
        assert second.cancel()
        assert second.wait(5) and time.perf_counter() - t0 < 2
        assert second.status == "cancelled" and second.events == [] and second.result is None
        assert one_line(second.error) == "cancelled: you pressed Cancel"
        assert wait_for(lambda: third.place_in_line() == 1, 5) and chef.queue_length() == 1
    finally:
        chef.device_lock.give_back(other)
    assert third.wait(WAIT_S) and third.status == "done", third.error


def test_quick_questions_are_answered_while_an_order_cooks(chef):
    """The order form asks between two steps of the loop, not after the order."""
    job = chef.submit(chef.check(LONGER.form()), "long")
    try:
        assert wait_for(lambda: any(isinstance(e, Token) for e in job.events)), job.error
        t0 = time.perf_counter()
        assert chef.limits(10, 20).max_batch >= 1 and chef.check(OrderForm([f"ROMEO {t0}:"], 1)).prompt_ids
        assert time.perf_counter() - t0 < 5 and not job.finished
    finally:
        job.cancel()
    assert job.wait(30)


def test_a_cancelled_order_whose_engine_cannot_stop_in_time_has_its_engine_replaced(monkeypatch):
    """The loop reads "cancel" only between steps; one stuck inside a step (here: a test hang after
    every step) is silent with the cancel in flight, so the watchdog stops it after its silence limit
    and the host loads a fresh one. The page's order ends at once either way."""
    monkeypatch.setenv(SILENCE_ENV, "6")  # the first step (a fresh engine's seats, a loaded machine) fits in it
    monkeypatch.setenv(TEST_HANG_ENV, "60")
    with own_kitchen("chef") as (svc, kitchens):
        client = process_of(kitchens)
        first_pid = client.pid
        monkeypatch.delenv(TEST_HANG_ENV)  # the replacement loop behaves
        job = svc.submit(svc.check(LONG.form()), "stuck")
        assert wait_for(lambda: job.events), job.error
        assert isinstance(job.events[0], PrefillStart)
        t0 = time.perf_counter()
        job.cancel()
        assert job.wait(30) and job.status == "cancelled" and job.error == "cancelled: you pressed Cancel"
        assert job.finished_at - t0 < 2  # the page is told at once, not after the 60 s hang
        assert wait_for(lambda: client.restarts == 1, 30)  # stopped at its 6 s limit, not after the hang
        assert_kitchen_still_cooks(svc)
        assert client.pid != first_pid and client.restarts == 1


def test_an_order_whose_page_is_gone_is_cancelled(kitchen, monkeypatch):
    chef, kitchens = kitchen
    monkeypatch.setattr(job_mod, "ABANDON_S", 1.0)  # the page-gone rule lives with the job
    page_open = threading.Event()
    page_open.set()
    job = chef.submit(chef.check(LONGER.form()), "watched")
    job.watch(page_open.is_set)
    assert wait_for(lambda: any(isinstance(e, Token) for e in job.events)), job.error
    time.sleep(1.5)
    assert not job.finished  # the page is there: the order cooks on
    page_open.clear()  # the tab is closed
    t0 = time.perf_counter()
    assert job.wait(15) and job.status == "cancelled" and job.error == PAGE_GONE
    assert job.finished_at - t0 < 1.0 + 2 * job_mod.WATCH_S + 3
    assert wait_for(lambda: nothing_in_flight(process_of(kitchens)), 10)  # the kitchen is free again


def test_an_engine_killed_between_orders_is_replaced_before_the_form_asks_it_anything(kitchen):
    """Killed while idle (the OS, out of memory): the host starts a fresh loop and the next question
    waits for it instead of failing."""
    chef, kitchens = kitchen
    client = process_of(kitchens)
    old, restarts = client.pid, client.restarts
    os.kill(old, signal.SIGKILL)
    assert wait_for(lambda: client.restarts == restarts + 1, 30)
    assert chef.limits(1, 8).max_batch >= 1 and client.pid != old
    assert_kitchen_still_cooks(chef)


# -- one stove per machine ---------------------------------------------------------------------------


def test_the_stove_line_is_first_come_first_served_and_a_waiting_order_can_leave_it():
    stove = DeviceLock("cpu-line")
    holder, a, b = LockTicket("chef: one"), LockTicket("apprentice: two"), LockTicket("chef: three")
    assert stove.take(holder)
    order, cancelled_b = [], threading.Event()
    ta = threading.Thread(target=lambda: stove.take(a) and order.append("a"))
    tb = threading.Thread(target=lambda: order.append("b") if stove.take(b, cancelled_b.is_set) else order.append("b left"))
    ta.start()
    assert wait_for(lambda: stove.place_of(a) == 1, 5)
    tb.start()
    assert wait_for(lambda: stove.place_of(b) == 2, 5)
    assert "apprentice" not in stove.waiting_line(b) and "chef: one is cooking; 1 more ahead" in stove.waiting_line(b)
    cancelled_b.set()
    stove.wake()
    tb.join(5)
    assert order == ["b left"] and stove.place_of(b) == 0
    stove.give_back(holder)
    ta.join(5)
    assert order == ["b left", "a"] and stove.holder is a


def test_the_meter_sees_another_process_on_the_engines_cores():
    """Something the stove cannot hold back (another program) is measured, not assumed away."""
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        meter = CoreMeter(ALL_CORES, idle.pid)  # the "engine" is idle: every busy core-second is another's
        burn = textwrap.dedent("""
            import time
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                pass
        """)
        subprocess.run([sys.executable, "-c", burn], check=True)
        verdict = meter.verdict()
        assert verdict is not None and "something else used the engine's cores" in verdict, verdict
        assert "\n" not in verdict
    finally:
        idle.kill()
        idle.wait()



def test_an_order_cooked_beside_another_program_on_its_cores_says_so(chef):
    """The stove holds back the kitchens of this server, not a program outside it: the order measures
    what else ran on its engine's cores and carries the line its panels show."""
    split = split_cores(chef.threads)
    core = max(split.engine if split is not None else ALL_CORES)  # where the kitchen's loop runs
    burn = textwrap.dedent(f"""
        import os, time
        os.sched_setaffinity(0, {{{core}}})
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pass
    """)
    burner = subprocess.Popen([sys.executable, "-c", burn])
    try:
        time.sleep(0.3)
        job = chef.submit(chef.check(LONG.form()), "beside a neighbour")
        assert job.wait(WAIT_S) and job.status == "done", job.error
    finally:
        burner.kill()
        burner.wait()
    assert job.shared_cores is not None and "something else used the engine's cores" in job.shared_cores
