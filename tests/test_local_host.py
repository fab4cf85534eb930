"""The Kitchen's client on a kitchen host in its own process (serving/host.py `LocalHost`).

The host here is a real class kitchen app (serving/server.py `create_app`) that no web server
serves: every answer the client gets came without HTTP, so the Cook that `two-pot-kitchen` runs
has no loopback hop. Same features as over HTTP: caps, cancel, the class board, the Lab."""

from __future__ import annotations

import time

import pytest
from conftest import CHEF_CONTEXT

from engine import Engine
from engine.errors import EngineError
from engine.events import Done, PrefillStart, Token
from engine.serving_core import DEFAULT_SEAT_LEN
from kitchen_viz.orders import Order, cook
from lab.on_server import LabRoutes
from lab.padding import PaddingSettings
from lab.progress import Progress
from lab.registry import LabRun
from serving import job as job_mod
from serving.caps import Caps
from serving.class_board import ClassBoard
from serving.engine_client import EngineClient, LoopSettings
from serving.host import NotReady
from serving.kitchen_client import ServerKitchen
from serving.kitchen_orders import LocalHost
from serving.metrics import KitchenMetrics
from serving.mounted import AppKitchens, KitchenRooms
from serving.server import ServerConfig, close_app, create_app, served_name

CAPS = Caps(max_order_tokens=2000, max_new_tokens=480, max_order_seconds=60)


@pytest.fixture(scope="module")
def app():
    name, source = served_name("chef")
    metrics = KitchenMetrics(name)
    client = EngineClient(LoopSettings(source, policy="chunked", token_budget=64, threads=1), metrics, ClassBoard())
    app = create_app(client, ServerConfig(name, "a-key-the-local-client-never-sends", CAPS), metrics, (LabRoutes,))
    yield app
    close_app(app)
    client.close()


@pytest.fixture(scope="module")
def ref():
    return Engine.load("chef")


@pytest.fixture()
def svc(app):
    k = ServerKitchen(LocalHost(lambda: app), "chef")
    assert k.wait_ready(60) and k.state == "ready", k.load_error
    yield k
    k.close()


def until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def nothing_running(app) -> bool:
    client = app.state.kitchen.client
    return client.in_flight == 0 and client.state.running == 0 and client.state.waiting == 0


def test_an_order_in_process_equals_generate_and_shows_on_the_board(svc, app, ref):
    assert svc.info.name == "chef" and svc.engine_pid == app.state.kitchen.client.pid
    assert "this server's own kitchen" in svc.where
    lim = svc.limits(100, 64)
    # a seat of the engine's default length, capped by the context, holds prompt + new tokens - 1
    assert lim.max_context == min(CHEF_CONTEXT, DEFAULT_SEAT_LEN + 1)
    o = Order(batch=3, max_new_tokens=10, temperature=0.0, seed=0, prompt_tokens=20)
    ids = svc.check(o.prompts(svc), 10, temperature=0.0, seed=0)
    assert [len(p) for p in ids] == [20, 20, 20] and svc.encode("ROMEO:") == ref.encode("ROMEO:")
    job = svc.submit(cook(o), o.label, hold=True)
    job.release(0.05)
    assert job.wait(60) and job.status == "done", job.error
    assert job.result.path == "class kitchen" and job.result.tokens == ref.generate(ids, max_new_tokens=10).tokens
    assert isinstance(job.events[0], PrefillStart) and isinstance(job.events[-1], Done)
    snap = svc.board(job.order_id)
    assert sum(s["mine"] for s in snap["steps"]) == 3 * 10  # its 3 tables in each of 10 passes
    until(lambda: nothing_running(app), "the finished order is still in flight")


def test_cancel_a_page_gone_and_a_time_limit_stop_the_order_in_process(svc, app, monkeypatch):
    long = Order(batch=2, max_new_tokens=480, temperature=0.0, seed=0, prompt_tokens=20)
    job = svc.submit(cook(long), long.label)
    until(lambda: any(isinstance(e, Token) for e in job.events), "the order never started cooking")
    assert job.cancel("cancelled: you pressed Cancel")
    assert job.wait(10) and job.status == "cancelled" and job.error == "cancelled: you pressed Cancel"
    assert not any(isinstance(e, Done) for e in job.events)
    until(lambda: nothing_running(app), "a cancelled order is still cooking")

    job = svc.submit(cook(long), long.label, time_limit_s=0.3)
    assert job.wait(30) and job.status == "cancelled" and job.error == "cancelled after 0.3 s (its time limit)"
    until(lambda: nothing_running(app), "an order past its time is still cooking")

    monkeypatch.setattr(job_mod, "ABANDON_S", 0.3)  # the page-gone rule, quicker than this order cooks
    monkeypatch.setattr(job_mod, "WATCH_S", 0.1)
    job = svc.submit(cook(long), long.label)
    until(lambda: any(isinstance(e, Token) for e in job.events), "the order never started cooking")
    job.watch(lambda: False)  # the page that ordered it is gone
    assert job.wait(30) and job.status == "cancelled" and "closed or reloaded" in job.error
    until(lambda: nothing_running(app), "an abandoned order is still cooking")


def test_refusals_in_process_are_the_servers_one_line(svc):
    with pytest.raises(EngineError) as err:
        svc.check(["x"], CHEF_CONTEXT + 100)
    assert f"context of {CHEF_CONTEXT:,}" in str(err.value) and "\n" not in str(err.value)
    job = svc.submit(cook(Order(batch=1, max_new_tokens=481, temperature=0.0, seed=0, text="hi")), "too long")
    assert job.wait(30) and job.status == "error"
    assert "instructor's limit is 480 new tokens" in job.error and "HTTP" not in job.error


def test_a_lab_sweep_runs_in_process(svc):
    settings = PaddingSettings(lengths=(8, 24), repeats=1)
    job = svc.submit(LabRun("padding", settings), label="lab: padding")
    assert job.wait(180) and job.status == "done", job.error
    assert type(job.result).__name__ == "PaddingResult" and job.result.settings == settings
    assert job.events and all(isinstance(e, Progress) for e in job.events)
    bad = svc.submit(LabRun("nope", settings), label="lab: nope")
    assert bad.wait(30) and bad.status == "error" and bad.error.startswith("no lab experiment 'nope'")


def test_a_host_that_is_loading_or_cannot_open_says_so_in_one_line():
    kitchens = AppKitchens(None, KitchenRooms(None))
    with pytest.raises(EngineError, match="no model 'nope' in this server's catalog"):
        kitchens.app_for("nope", "cpu", "float32")

    def loading():
        raise NotReady("the kitchen is loading chef on cpu (float32); try again in a few seconds")

    k = ServerKitchen(LocalHost(loading), "apprentice")
    chef = ServerKitchen(LocalHost(loading), "chef")
    try:
        assert not k.wait_ready(0.5) and k.state == "loading"  # it keeps asking while the host loads
        assert "MB of chef on cpu (float32)" in chef.loading_message  # the page says what it loads
        assert chef.weights_mb and 1 < chef.weights_mb < 40  # known from the catalog before loading
    finally:
        k.close()
        chef.close()
    failed = ServerKitchen(LocalHost(lambda: (_ for _ in ()).throw(EngineError("the kitchen could not start: x"))),
                           "chef")  # fmt: skip
    try:
        assert failed.wait_ready(10) and failed.state == "error"
        assert failed.load_error == "this server's own kitchen did not serve chef: the kitchen could not start: x"
    finally:
        failed.close()
