"""The live view's feed: an order's state as the drawn kitchen fetches it, on the real chef.

The feed is what the scene reads twice a second while an order cooks under
`two-pot-kitchen` (kitchen_viz/live_feed.py). These tests go through the same Starlette route the
server mounts (with Starlette's TestClient) and compare what it says with the job's own events.
The browser side (the scene fetching it, and falling back to ticks when it cannot) is in
tests/test_browser.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from own_kitchen import own_kitchen
from starlette.applications import Starlette
from starlette.testclient import TestClient

from engine.events import StepEnd
from kitchen_viz import live_feed
from kitchen_viz.orders import Order
from kitchen_viz.timeline import LiveRun
from serving.device_lock import LockTicket

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
WAIT_S = 120


@pytest.fixture(scope="module")
def kitchen():
    """The Kitchen's kitchen as the app runs it (tests/own_kitchen.py)."""
    with own_kitchen("chef") as (svc, _):
        yield svc


@pytest.fixture(scope="module")
def client():
    """The feed's routes alone, as the server mounts them (without switching this process's pages to them)."""
    with TestClient(Starlette(routes=[live_feed.feed_stream_route(), live_feed.feed_route()])) as c:
        yield c


def fed_order(kitchen, new_tokens: int, **kw):
    order = Order(batch=2, max_new_tokens=new_tokens, temperature=0.0, seed=0, prompt_tokens=12)
    checked = kitchen.check(order.form())
    job = kitchen.submit(checked, order.label, **kw)
    run = LiveRun.for_order("order-1", checked.prompt_tokens)
    url = live_feed.open_feed(kitchen, job, run, presenter=False, wok_capacity=4096)
    return job, url


def test_the_feed_follows_the_order_step_by_step_then_says_done(kitchen, client):
    job, url = fed_order(kitchen, new_tokens=480)  # about 0.2 s at the native step's pace: several looks land mid-cook
    assert url.startswith(live_feed.FEED_PATH) and len(url) > len(live_feed.FEED_PATH) + 16
    seen = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        reply = client.get(url)
        assert reply.status_code == 200 and reply.headers["cache-control"] == "no-store"
        data = reply.json()
        if data["done"]:
            break
        seen.append(data)
        time.sleep(0.02)
    assert data == {"status": "done", "done": True}
    assert job.status == "done"
    measured = [e.step for e in job.events if isinstance(e, StepEnd) and e.step.phase == "decode"]
    steps = [len(d["steps"]) for d in seen]
    assert steps == sorted(steps) and any(0 < n < len(measured) for n in steps), steps  # seen mid-cook
    last = seen[-1]  # what the feed said last equals what the engine measured, step for step
    assert [s[1] for s in last["steps"]] == [round(s.t_end, 5) for s in measured[: len(last["steps"])]]
    assert last["run_id"] == "order-1" and last["batch"] == 2 and last["prompt_tokens"] == [12, 12]
    assert last["kv_bytes_per_token"] == kitchen.info.kv_bytes_per_token
    assert last["panels"]["ttft"].endswith("ms") and last["panels"]["steps"] == len(last["steps"])


def test_the_stream_sends_each_change_once_then_done(kitchen, client, monkeypatch):
    """The scene follows one stream: every event is the order's state, none repeats the one before
    (nothing is sent while nothing changed), the decode steps only grow, and the last event says done.
    The stream looks every 20 ms here, not twice a second: at the native step's pace the whole order
    can finish between two looks 0.5 s apart, and then no mid-cook state is ever sent."""
    monkeypatch.setattr(live_feed, "STREAM_S", 0.02)
    monkeypatch.setattr(live_feed, "DONE_LOOK_S", 0.01)
    job, url = fed_order(kitchen, new_tokens=480)
    events = []
    with client.stream("GET", live_feed.stream_url(url)) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert job.status == "done"
    assert json.loads(events[-1]) == {"status": "done", "done": True}
    states = [json.loads(e) for e in events[:-1]]
    assert all(a != b for a, b in zip(events, events[1:], strict=False))  # a state is sent only when it changed
    steps = [len(d["steps"]) for d in states]
    assert steps == sorted(steps) and any(0 < n < 479 for n in steps), steps  # seen mid-cook
    assert all(d["run_id"] == "order-1" and not d["done"] for d in states)


def test_the_stream_says_done_as_soon_as_the_order_finishes(kitchen, client, monkeypatch):
    """The page's final numbers wait for the done event, so it does not wait for the next look at the
    order's state: with looks a minute apart, a short order's stream still ends within seconds."""
    monkeypatch.setattr(live_feed, "STREAM_S", 60.0)
    job, url = fed_order(kitchen, new_tokens=8)
    t0 = time.monotonic()
    with client.stream("GET", live_feed.stream_url(url)) as reply:
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-1]) == {"status": "done", "done": True} and job.status == "done"
    assert time.monotonic() - t0 < 30, "the done event waited for the next look (STREAM_S)"


def test_the_stream_of_an_unknown_order_is_a_404_with_one_line(client):
    reply = client.get(live_feed.stream_url(live_feed.FEED_PATH + "no-such-token"))
    assert reply.status_code == 404 and reply.json() == {"error": "no such order in this kitchen"}


def test_a_waiting_order_is_told_its_place_in_line(kitchen, client):
    """Another kitchen cooks on this machine's stove: the order waits in its line and says who cooks."""
    other = LockTicket("apprentice: cook 8 table(s)", kitchen="another kitchen")
    assert kitchen.device_lock.take(other)
    try:
        job, url = fed_order(kitchen, new_tokens=4)
        deadline = time.monotonic() + 10
        while job.place_in_line() != 1 and time.monotonic() < deadline:  # its kitchen takes a ticket
            time.sleep(0.02)
        assert job.place_in_line() == 1
        data = client.get(url).json()
        assert data["status"] == "queued" and not data["done"] and data["steps"] == []
        wait = data["panels"]["wait"]
        assert "Waiting for the stove (cpu): apprentice: cook 8 table(s) is cooking" in wait, wait
    finally:
        kitchen.device_lock.give_back(other)
    assert job.wait(WAIT_S) and job.status == "done", job.error
    assert client.get(url).json()["done"]


def test_an_unknown_order_is_a_404_with_one_line(client):
    reply = client.get(live_feed.FEED_PATH + "no-such-token")
    assert reply.status_code == 404 and reply.json() == {"error": "no such order in this kitchen"}


def test_finished_feeds_are_forgotten_after_keep_s(kitchen, client, monkeypatch):
    job, url = fed_order(kitchen, new_tokens=2)
    assert job.wait(WAIT_S) and client.get(url).json()["done"]
    monkeypatch.setattr(live_feed, "KEEP_S", 0.0)
    _, newer = fed_order(kitchen, new_tokens=2)  # opening a feed forgets the finished ones
    assert client.get(url).status_code == 404
    assert client.get(newer).status_code == 200


def test_the_served_app_mounts_the_feed_and_plain_streamlit_runs_without_it():
    """`two-pot-kitchen` runs serve.py, which Streamlit recognises as an st.App with our route;
    this test process (like AppTest and `streamlit run app.py`) never mounted it."""
    from streamlit.web.server.app_discovery import discover_asgi_app

    from kitchen_viz.launch import SERVE

    found = discover_asgi_app(SERVE)
    assert found.is_asgi_app and found.app_name == "app"
    assert not live_feed.serving()


def test_the_route_and_its_urls_follow_streamlits_base_url_path():
    from streamlit import config

    before = config.get_option("server.baseUrlPath")
    config.set_option("server.baseUrlPath", "/kitchen/")
    try:
        assert live_feed.feed_route().path == "/kitchen/two-pot/feed/{token}"
        assert live_feed.feed_url("abc") == "/kitchen/two-pot/feed/abc"
        assert live_feed.feed_stream_route().path == "/kitchen/two-pot/feed/{token}/stream"
        assert live_feed.stream_url(live_feed.feed_url("abc")) == "/kitchen/two-pot/feed/abc/stream"
    finally:
        config.set_option("server.baseUrlPath", before)
    assert live_feed.feed_url("abc") == "/two-pot/feed/abc"


def test_the_live_view_is_the_default_where_the_feed_is_served(monkeypatch):
    """Measured inside the 3 % budget on 2 cores with the feed, not with fragment ticks
    (docs/benchmarks/ui-overhead.md): so the default depends on which one this server has."""
    from kitchen_viz import order_form

    monkeypatch.setattr(order_form.os, "cpu_count", lambda: 2)
    assert not order_form.live_view_default()  # ticks only (AppTest, `streamlit run app.py`)
    monkeypatch.setattr(live_feed, "_MOUNTED", threading.Event())
    live_feed._MOUNTED.set()
    assert order_form.live_view_default()  # served by two-pot-kitchen
    monkeypatch.setattr(live_feed, "_MOUNTED", threading.Event())
    monkeypatch.setattr(order_form.os, "cpu_count", lambda: 4)
    assert order_form.live_view_default()


def test_the_scene_gets_the_class_rail_while_a_class_kitchen_order_cooks():
    """A job on a class kitchen carries the board its client reads while it cooks (serving/host_client.py);
    the scene's data then holds the rail: tickets only, yours highlighted, and none once the job is done."""
    from types import SimpleNamespace

    from serving.job import Job

    svc = SimpleNamespace(info=SimpleNamespace(kv_bytes_per_token=6144), queue_length=lambda: 1)
    job = Job(label="cook", work=None, status="running")
    job.board = {"tickets": [{"ticket": 4, "mine": True, "state": "running", "prompt_tokens": 12, "tokens": 3},
                             {"ticket": 5, "mine": False, "state": "waiting", "prompt_tokens": 40, "tokens": 0}]}  # fmt: skip
    run = LiveRun.for_order("r", [12])
    data = live_feed.live_scene_data(svc, job, run, presenter=False, wok_capacity=4096, panels=None)
    rail = data["class_rail"]
    assert "you · #4" in rail and "#5" in rail and "you · #5" not in rail and "waiting for a seat" in rail
    job.status = "done"
    assert live_feed.live_scene_data(svc, job, run, presenter=False, wok_capacity=4096, panels=None)["class_rail"] is None
    job.status, job.board = "running", None  # a server that keeps no board
    assert live_feed.live_scene_data(svc, job, run, presenter=False, wok_capacity=4096, panels=None)["class_rail"] is None
    # Before its first read the board is pending: one placeholder card keeps the rail's place, so the
    # first read (while the engine cooks) changes the cards without moving the kitchen below them.
    from serving.host_client import PENDING_BOARD

    job.board = dict(PENDING_BOARD)
    rail = live_feed.live_scene_data(svc, job, run, presenter=False, wok_capacity=4096, panels=None)["class_rail"]
    assert "reading the board" in rail and rail.count("<span") == 1 and "you ·" not in rail
