"""One stove per machine on the kitchen host: two models never cook at the same time on one device.

Two real kitchens of this process (serving/http/mounted.py `HostRooms`, the chef and the apprentice,
each in its kitchen-loop process) reached in process, as the Kitchen reaches them whatever the
launch. The chef's engine pauses 20 ms after every step (its test hook), so its order is long.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import use_settings

from kitchen_viz.orders import Order
from serving.device_lock import DeviceLock, LockTicket
from serving.host.loop import TEST_HANG_ENV
from serving.host_client import HostClient
from serving.http.mounted import AppHosts, HostRooms

WAIT_S = 120
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_tickets_of_one_kitchen_cook_together_and_another_kitchen_waits():
    stove = DeviceLock("cpu-kitchens")
    a1, a2, b = LockTicket("chef: one", kitchen="chef"), LockTicket("chef: two", kitchen="chef"), LockTicket("apprentice: x", kitchen="apprentice")
    assert stove.take(a1) and stove.take(a2)  # one kitchen's orders share its batch
    took = []
    t = threading.Thread(target=lambda: stove.take(b) and took.append("b"))
    t.start()
    assert wait_for(lambda: stove.place_of(b) == 1, 5)
    assert "chef: one is cooking" in stove.waiting_line(b)
    stove.give_back(a1)
    time.sleep(0.2)
    assert took == []  # the chef's second order still cooks
    stove.give_back(a2)
    t.join(5)
    assert took == ["b"] and stove.holder is b
    alone = LockTicket("private job")  # no kitchen: cooks alone
    waiting = threading.Thread(target=lambda: stove.take(alone))
    waiting.start()
    assert wait_for(lambda: stove.place_of(alone) == 1, 5)
    stove.give_back(b)
    waiting.join(5)
    assert stove.holder is alone


def test_two_models_on_the_kitchen_host_never_cook_at_once_and_the_second_is_told_why(monkeypatch):
    use_settings(monkeypatch, threads=1)
    monkeypatch.setenv(TEST_HANG_ENV, "0.02")  # the chef's loop only: it starts first
    kitchens = AppHosts(None, HostRooms(None))
    chef = HostClient(kitchens.host_for("chef", "cpu", "float32"), "chef")
    apprentice = None
    try:
        assert chef.wait_ready(WAIT_S) and chef.state == "ready", chef.load_error
        monkeypatch.delenv(TEST_HANG_ENV)
        apprentice = HostClient(kitchens.host_for("apprentice", "cpu", "float32"), "apprentice")
        assert apprentice.wait_ready(WAIT_S) and apprentice.state == "ready", apprentice.load_error
        long = Order(batch=2, max_new_tokens=200, temperature=0.0, seed=0, text="ROMEO:")
        chef_job = chef.submit(chef.check(long.form()), "the chef's long order")
        assert wait_for(lambda: chef_job.events, WAIT_S), chef_job.error
        also_chef = chef.submit(chef.check(long.form()), "the chef's second order")  # the same kitchen: joins its batch
        small = Order(batch=1, max_new_tokens=4, temperature=0.0, seed=0, text="ROMEO:")
        app_job = apprentice.submit(apprentice.check(small.form()), "a tiny order")
        assert wait_for(lambda: app_job.waiting_line() is not None, 30)
        line = app_job.waiting_line()
        assert "Waiting for the stove (cpu" in line and "chef: the chef's long order is cooking" in line, line
        assert wait_for(lambda: also_chef.events, 30) and not chef_job.finished  # together, not in line
        assert app_job.events == [] and not app_job.finished
        assert chef_job.wait(WAIT_S) and chef_job.status == "done", chef_job.error
        assert also_chef.wait(WAIT_S) and also_chef.status == "done", also_chef.error
        assert app_job.wait(WAIT_S) and app_job.status == "done", app_job.error
        assert app_job.started_at >= max(chef_job.finished_at, also_chef.finished_at)  # never together
        assert app_job.waiting_line() is None and app_job.events
    finally:
        chef.close()
        if apprentice is not None:
            apprentice.close()
        kitchens.rooms.close()
