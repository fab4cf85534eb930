"""The live view's feed: the kitchen's latest measurements, streamed to the scene itself.

Why a feed instead of a Streamlit rerun per tick: on a small machine the browser shares cores with
the engine being measured, and a fragment rerun is expensive for the browser. Each one marks the
fragment's elements stale, runs several React passes over the page (25-50 ms of main-thread work
per tick in traced runs) and re-lays-out the page, all to change a few numbers and bowls inside
one component (docs/benchmarks/ui-overhead.md). With the feed, the page draws the scene once when
Cook is pressed; the scene's script then follows the order's state as server-sent events
(`GET <base>/two-pot/feed/<token>/stream`): this server looks twice a second and sends the
state only when it changed, the scene draws what changed, and asks Streamlit for a rerun only
once, when the order is done, so the page can draw the engine's final numbers. One stream rather
than a fetch every 250 ms: each fetch cost the browser ~5.6 ms of its threads even when nothing
had changed (traced), about a third of a still frame's cost, and a stream sends nothing then.
`GET <base>/two-pot/feed/<token>` answers the same state once, as JSON.

`two-pot-kitchen` serves the app through `serve.py` (Streamlit's `st.App`), which mounts
`feed_routes()`. Run as plain `streamlit run app.py` (or in AppTest) there is no route, `serving()`
is False and the live view falls back to the fragment's ticks; a scene whose fetches fail three
times in a row asks for the same fallback.

Worked example (one order, as the scene sees it):
    token = open_feed(svc, job, run, presenter=False, wok_capacity=4096)
    read_feed(token) -> {"status": "queued", "panels": {..., "wait": "Your order is number 2 ..."}, ...}
    read_feed(token) -> {"status": "running", "steps": [[0.0112, 0.0146, 73728], ...], ...}
    read_feed(token) -> {"status": "done", "done": True}   # the scene triggers the final rerun
"""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
import threading
import time
from dataclasses import dataclass, field

from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from streamlit import config

from kitchen_viz.class_rail import rail_html
from kitchen_viz.live_panels import live_panel_data
from kitchen_viz.panels import PanelValues, panel_values
from kitchen_viz.timeline import LiveRun
from serving.host_client import HostClient
from serving.job import Job

CLASS_RAIL_TITLE = "<div class='tpk-class-rail-title'>The class kitchen's rail: every order in the pot now</div>"
FEED_PATH = "/two-pot/feed/"  # + token; under Streamlit's server.baseUrlPath
STREAM_S = 0.5  # the stream looks at the order twice a second
DONE_LOOK_S = 0.05  # and whether it has finished twenty times a second: the final rerun starts at once
STREAM_SUFFIX = "/stream"
KEEP_S = 600.0  # a feed is forgotten this long after its order finished
NO_FEED = "no such order in this kitchen"

_FEEDS: dict[str, Feed] = {}
_LOCK = threading.Lock()
_MOUNTED = threading.Event()


@dataclass
class Feed:
    """One order's feed: its job, a timeline of its own (the page keeps another), the scene's settings."""

    svc: HostClient  # the session's kitchen: for the place in line
    job: Job  # its kitchen appends the events
    run: LiveRun
    presenter: bool
    wok_capacity: int
    lock: threading.Lock = field(default_factory=threading.Lock)


def queue_line(place: int, in_kitchen: int) -> str:
    """What a waiting order is told (the page's st.info and the scene's panel say the same)."""
    return (
        f"Your order is number {place} in line ({in_kitchen} orders in the kitchen); "
        "other browser sessions share this kitchen and take turns."
    )


def wait_line(svc, job) -> str:
    """What a waiting order is told: the machine's stove line, naming the order cooking on it, when
    another kitchen holds the stove (serving/device_lock.py); else its place in this kitchen's line."""
    stove = job.waiting_line() if hasattr(job, "waiting_line") else None
    if stove:
        return stove
    place = job.place_in_line()
    return queue_line(place, svc.queue_length()) if place else "Your order is next: the kitchen is taking it."


def waited_s(job) -> float | None:
    """How long the order waited in line, once its kitchen has started it (None before)."""
    return job.queue_wait_s if job is not None and job.started_at else None


def live_scene_data(
    svc, job, run: LiveRun, *, presenter: bool, wok_capacity: int, panels: PanelValues | None
) -> dict:
    """The scene's data for an order in the kitchen, from a run its caller has just folded the
    job's events into: the timeline so far, the KV size per token and, given the panels' values,
    the live panels' numbers (with the place in line while the order waits). The fragment's ticks
    and the feed both draw from this one function."""
    data = run.scene_data(presenter=presenter, wok_capacity=wok_capacity)
    data["kv_bytes_per_token"] = svc.info.kv_bytes_per_token if svc.info else 0
    data["panels"] = None
    board = getattr(job, "board", None)  # a class kitchen's board, read while the order cooks
    data["class_rail"] = (CLASS_RAIL_TITLE + rail_html(board, counts=False)) if board is not None and not job.finished else None
    if panels is not None:
        data["panels"] = live_panel_data(panels, waited_s(job))
        if job.status in ("queued", "loading"):
            data["panels"]["wait"] = wait_line(svc, job)
    return data


def open_feed(svc, job, run: LiveRun, *, presenter: bool, wok_capacity: int) -> str:
    """Register an order's feed and return its URL path (a fresh unguessable token per order)."""
    token = secrets.token_urlsafe(16)
    feed = Feed(svc, job, copy.deepcopy(run), presenter, wok_capacity)
    with _LOCK:
        _forget_finished()
        _FEEDS[token] = feed
    return feed_url(token)


def read_feed(token: str) -> dict | None:
    """The order's state now (None for an unknown or forgotten token). Once the order is finished
    the feed says only `done`: the page's final rerun draws the engine's own numbers."""
    with _LOCK:
        feed = _FEEDS.get(token)
    if feed is None:
        return None
    if feed.job.finished:
        return {"status": feed.job.status, "done": True}
    with feed.lock:  # two tabs polling one token must not fold the same events twice
        feed.run.consume(feed.job.events)
        data = live_scene_data(
            feed.svc,
            feed.job,
            feed.run,
            presenter=feed.presenter,
            wok_capacity=feed.wok_capacity,
            panels=panel_values(feed.run),
        )
    data["status"], data["done"] = feed.job.status, False
    return data


def _forget_finished() -> None:
    now = time.perf_counter()  # the clock of Job.finished_at
    for token, feed in list(_FEEDS.items()):
        if feed.job.finished_at is not None and now - feed.job.finished_at > KEEP_S:
            del _FEEDS[token]


# -- the HTTP side (Starlette, inside the Streamlit server's process) -----------------------------


def base_path() -> str:
    """Streamlit's server.baseUrlPath as a path prefix: '' or '/kitchen'."""
    base = (config.get_option("server.baseUrlPath") or "").strip("/")
    return f"/{base}" if base else ""


def feed_url(token: str) -> str:
    return f"{base_path()}{FEED_PATH}{token}"


def feed_route():
    """The feed's Starlette route: GET <base>/two-pot/feed/<token> -> the order's state as JSON
    (404 with a one-line reason for an unknown token)."""
    async def feed(request):
        data = read_feed(request.path_params["token"])
        if data is None:
            return JSONResponse({"error": NO_FEED}, status_code=404)
        return JSONResponse(data, headers={"Cache-Control": "no-store"})

    return Route(f"{base_path()}{FEED_PATH}{{token}}", feed, methods=["GET"])


def stream_url(url: str) -> str:
    """The server-sent-events form of a feed's URL (what the scene follows)."""
    return url + STREAM_SUFFIX


async def feed_events(token: str, request=None):
    """The order's state as server-sent events: `data: {...}` each time it changed (looked at every
    STREAM_S), ending with `{"done": true, ...}` as soon as the order finishes (DONE_LOOK_S: a short
    answer is over within one STREAM_S, and the page's final numbers wait for that event). A client
    that goes away ends the stream at the next look; an order forgotten meanwhile ends it with one
    `{"error": ...}` event."""
    last = None
    while request is None or not await request.is_disconnected():
        data = read_feed(token)
        if data is None:
            yield f"data: {json.dumps({'error': NO_FEED})}\n\n"
            return
        text = json.dumps(data, separators=(",", ":"))
        if text != last:
            yield f"data: {text}\n\n"
            last = text
        if data["done"]:
            return
        await _until_next_look(token)


async def _until_next_look(token: str) -> None:
    """STREAM_S, or less once the order has finished (or its feed is gone)."""
    with _LOCK:
        feed = _FEEDS.get(token)
    waited = 0.0
    while waited < STREAM_S and feed is not None and not feed.job.finished:
        await asyncio.sleep(DONE_LOOK_S)
        waited += DONE_LOOK_S


def feed_stream_route():
    """GET <base>/two-pot/feed/<token>/stream -> `text/event-stream` of the order's state (404 with
    a one-line reason for an unknown token)."""
    async def stream(request):
        token = request.path_params["token"]
        if read_feed(token) is None:
            return JSONResponse({"error": NO_FEED}, status_code=404)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}  # no proxy may hold events back
        return StreamingResponse(feed_events(token, request), media_type="text/event-stream", headers=headers)

    return Route(f"{base_path()}{FEED_PATH}{{token}}{STREAM_SUFFIX}", stream, methods=["GET"])


def feed_routes() -> list:
    """What serve.py hands `st.App(routes=...)`; mounting the routes switches the live view to them."""
    _MOUNTED.set()
    return [feed_stream_route(), feed_route()]


def serving() -> bool:
    """True when this server answers the feed (started by `two-pot-kitchen`, through serve.py)."""
    return _MOUNTED.is_set()
