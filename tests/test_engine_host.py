"""The Kitchen's client on a host in its own process, called directly (serving/host/host.py `EngineHost`).

No web server is involved: every answer the client gets came without HTTP (the class server's
routes are an adapter over this same object), so the Cook that `two-pot-kitchen` runs has no
loopback hop. Same features as over HTTP: caps and the time cap, cancel, the class board, the Lab."""

from __future__ import annotations

import time

import pytest
from conftest import CHEF_CONTEXT

from engine import Engine
from engine.errors import EngineError
from engine.events import Done, PrefillStart, Token
from engine.serving_core import DEFAULT_SEAT_LEN
from engine.settings import EngineSettings
from kitchen_viz.orders import Order
from lab.padding import PaddingSettings
from lab.progress import Progress
from lab.registry import LabRun
from lab.sweeps import LabSweeps
from serving import job as job_mod
from serving.caps import Caps
from serving.host.api import NotReady, OrderForm
from serving.host.loop import LoopSettings
from serving.host_client import HostClient
from serving.http.mounted import AppHosts, HostRooms
from serving.http.server import open_host

CAPS = Caps(max_order_tokens=2000, max_new_tokens=480, max_order_seconds=60)


@pytest.fixture(scope="module")
def host():
    settings = LoopSettings("chef", EngineSettings(policy="chunked", token_budget=64, prefix_cache=True), threads=1)
    h = open_host("chef", settings, CAPS, LabSweeps())
    assert h.wait_ready(120), h.status
    yield h
    h.close()


@pytest.fixture(scope="module")
def ref():
    return Engine.load("chef")


@pytest.fixture()
def svc(host):
    k = HostClient(host, "chef")
    assert k.wait_ready(60) and k.state == "ready", k.load_error
    yield k
    k.close()


def until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def nothing_running(host) -> bool:
    p = host.process
    return p.in_flight == 0 and p.state.running == 0 and p.state.waiting == 0


def test_an_order_in_process_equals_generate_and_shows_on_the_board(svc, host, ref):
    assert svc.info.name == "chef" and svc.engine_pid == host.process.pid
    assert "this server's own kitchen" in svc.where
    lim = svc.limits(100, 64)
    # a seat of the engine's default length, capped by the context, holds prompt + new tokens - 1
    assert lim.max_context == min(CHEF_CONTEXT, DEFAULT_SEAT_LEN + 1)
    o = Order(batch=3, max_new_tokens=10, temperature=0.0, seed=0, prompt_tokens=20)
    sent = dict(host.process.sent)
    checked = svc.check(o.form())
    ids = checked.prompt_ids
    assert [len(p) for p in ids] == [20, 20, 20]
    assert svc.check(OrderForm(["ROMEO:"], 1)).prompt_ids == [ref.encode("ROMEO:")]
    assert svc.check(o.form()) is checked  # the same question is asked of the engine once
    job = svc.submit(checked, o.label, hold=True)
    job.release(0.05)
    assert job.wait(60) and job.status == "done", job.error
    assert job.result.path == "class kitchen" and job.result.tokens == ref.generate(ids, max_new_tokens=10).tokens
    assert isinstance(job.events[0], PrefillStart) and isinstance(job.events[-1], Done)
    snap = svc.board(job.order_id)
    assert sum(s["mine"] for s in snap["steps"]) == 3 * 10  # its 3 tables in each of 10 passes
    # the engine was asked two questions (the order's ids, ROMEO's) and sent one order: no limits asked
    assert {k: v - sent.get(k, 0) for k, v in host.process.sent.items() if v != sent.get(k, 0)} == \
        {"Check": 2, "PlaceOrder": 1}  # fmt: skip
    until(lambda: nothing_running(host), "the finished order is still in flight")


def test_cancel_and_a_page_gone_stop_the_order_in_process(svc, host, monkeypatch):
    long = Order(batch=2, max_new_tokens=480, temperature=0.0, seed=0, prompt_tokens=20)
    job = svc.submit(svc.check(long.form()), long.label)
    until(lambda: any(isinstance(e, Token) for e in job.events), "the order never started cooking")
    assert job.cancel("cancelled: you pressed Cancel")
    assert job.wait(10) and job.status == "cancelled" and job.error == "cancelled: you pressed Cancel"
    assert not any(isinstance(e, Done) for e in job.events)
    until(lambda: nothing_running(host), "a cancelled order is still cooking")

    monkeypatch.setattr(job_mod, "ABANDON_S", 0.3)  # the page-gone rule, quicker than this order cooks
    monkeypatch.setattr(job_mod, "WATCH_S", 0.1)
    job = svc.submit(svc.check(long.form()), long.label)
    until(lambda: any(isinstance(e, Token) for e in job.events), "the order never started cooking")
    job.watch(lambda: False)  # the page that ordered it is gone
    assert job.wait(30) and job.status == "cancelled" and "closed or reloaded" in job.error
    until(lambda: nothing_running(host), "an abandoned order is still cooking")


def test_the_instructors_time_cap_is_the_hosts(host, monkeypatch):
    """Past the cap, the host cancels the order and its stream ends in the caps' one line."""
    monkeypatch.setattr(host, "caps", Caps(max_order_tokens=2000, max_new_tokens=480, max_order_seconds=0.3))
    svc = HostClient(host, "chef")
    try:
        assert svc.wait_ready(30)
        long = Order(batch=16, max_new_tokens=480, temperature=0.0, seed=0, prompt_tokens=20)  # ~2 s: 6x the cap
        job = svc.submit(svc.check(long.form()), long.label)
        assert job.wait(30) and job.status == "cancelled"
        assert job.error == "cancelled after 0.3 s: the instructor's limit per order is 0.3 s"
        until(lambda: nothing_running(host), "an order past its time is still cooking")
    finally:
        svc.close()


def test_refusals_in_process_are_the_hosts_one_line(svc):
    with pytest.raises(EngineError) as err:
        svc.check(OrderForm(["x"], CHEF_CONTEXT + 100))
    assert f"context of {CHEF_CONTEXT:,}" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(EngineError) as err:
        svc.check(Order(batch=1, max_new_tokens=481, temperature=0.0, seed=0, text="hi").form())
    assert "instructor's limit is 480 new tokens" in str(err.value) and "HTTP" not in str(err.value)


def test_a_lab_sweep_runs_in_process(svc):
    settings = PaddingSettings(lengths=(8, 24), repeats=1)
    job = svc.submit(LabRun("padding", settings), label="lab: padding")
    assert job.wait(180) and job.status == "done", job.error
    assert type(job.result).__name__ == "PaddingResult" and job.result.settings == settings
    assert job.events and all(isinstance(e, Progress) for e in job.events)
    bad = svc.submit(LabRun("nope", settings), label="lab: nope")
    assert bad.wait(30) and bad.status == "error" and bad.error.startswith("no lab experiment 'nope'")
    wrong = svc.submit(LabRun("tables", settings), label="lab: tables with padding's settings")
    assert wrong.wait(30) and wrong.status == "error" and "the settings of experiment 'tables'" in wrong.error


def test_a_host_that_is_loading_or_cannot_open_says_so_in_one_line():
    hosts = AppHosts(None, HostRooms(None))
    with pytest.raises(EngineError, match="no model 'nope' in this server's catalog"):
        hosts.host_for("nope", "cpu", "float32")

    def loading():
        raise NotReady("the kitchen is loading chef on cpu (float32); try again in a few seconds")

    k = HostClient(loading, "apprentice")
    chef = HostClient(loading, "chef")
    try:
        assert not k.wait_ready(0.5) and k.state == "loading"  # it keeps asking while the host loads
        assert "MB of chef on cpu (float32)" in chef.loading_message  # the page says what it loads
        assert chef.weights_mb and 1 < chef.weights_mb < 40  # known from the catalog before loading
    finally:
        k.close()
        chef.close()
    failed = HostClient(lambda: (_ for _ in ()).throw(EngineError("the kitchen could not start: x")), "chef")
    try:
        assert failed.wait_ready(10) and failed.state == "error"
        assert failed.load_error == "this server's own kitchen did not serve chef: the kitchen could not start: x"
    finally:
        failed.close()
