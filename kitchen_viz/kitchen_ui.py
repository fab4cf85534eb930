"""The Kitchen page's cooking: queue the order, follow it live, hand over to the outcome.

The order form is kitchen_viz/order_form.py (`order_ui`), the outcome and the diagnosis
kitchen_viz/outcome.py (`draw_outcome`); this module starts a Cook and follows it. While an order cooks in the live view, the scene (one component, which redraws only what
changed, without animation, so the browser takes little from the engine) gets the order's
measurements, the live panels' numbers included, one of two ways:

  feed   (served by `two-pot-kitchen`) the page draws the scene once; the scene's script follows
         the order's state as a stream of server-sent events from the server's feed route (at most
         four a second, only when it changed; kitchen_viz/live_feed.py) and triggers one fragment
         rerun when the order is done;
  ticks  (plain `streamlit run app.py`, AppTest, or a feed that failed) a fragment wakes four times
         a second, folds the job's new events into the session's `LiveRun` and hands the scene
         its data.

Either way, once the order is done the page reruns once and draws the ordinary panels.

Session state this page keeps (per browser session):
    tpk_job     the Job on the session's kitchen (serving/job.py)
    tpk_run     the LiveRun folded from that job's events (kitchen_viz.timeline)
    tpk_feed    (job, URL path) of the job's feed, while the live view follows it
    tpk_feed_failed  why the scene could not read its feed (the session then uses ticks)
    tpk_error   the one-line reason the last order was refused, if it was (outcome.py reads it)
"""

from __future__ import annotations

import uuid

import streamlit as st

from engine.errors import EngineError
from kitchen_viz import live_feed
from kitchen_viz.order_control import is_cooking, quiet_wait, watch_session
from kitchen_viz.order_form import K_FORM_HIDDEN, K_LIVE, live_view_default
from kitchen_viz.orders import Order
from kitchen_viz.outcome import draw_failed_order, draw_outcome
from kitchen_viz.panels import draw_panels, draw_timeline, panel_values
from kitchen_viz.scene import ART, draw_scene
from kitchen_viz.timeline import LiveRun
from serving.heap import freeze_heap
from serving.host_client import HostClient
from serving.job import SETTLE_S

TICK_S = 0.25  # how often the live view looks for new events while an order cooks
LOADING_LOOK_S = 0.2  # how often the page looks whether the kitchen's host has loaded
K_FEED, K_FEED_FAILED = "tpk_feed", "tpk_feed_failed"
QUIET_WAIT_S = 600  # the longest a page waits, without refreshing, for an order it is not watching


def draw_loading(svc: HostClient) -> None:
    """While the kitchen host loads the weights: say what is loading, then rerun once it is ready
    (looked at every LOADING_LOOK_S: the assistant's host is ready about a second after it starts)."""
    st.session_state[K_FORM_HIDDEN] = True  # the order form (and its live toggle) is not drawn now

    @st.fragment(run_every=LOADING_LOOK_S)
    def wait():
        if svc.state == "loading":
            st.info(f"{svc.loading_message}…", icon=":material/hourglass_top:")
        else:
            st.rerun()

    wait()


def start_cook(svc: HostClient, order: Order) -> None:
    """Check the order with the kitchen's host, queue it, and start a fresh timeline for it.

    The check is the order's one question to the engine before it cooks: the host answers with its
    tables' token ids (the engine's limits met, then the instructor's caps), and the order cooks
    those ids. A refused order never joins the queue and its reason is shown instead. The timeline
    starts with the tables' token counts, so the scene's first drawing of tickets and tables is part
    of the Cook rerun the browser paints before the engine starts; measured, that first drawing was
    the largest raster burst at a live tick (docs/benchmarks/ui-overhead.md). The job is watched:
    closing or reloading the page cancels it (order_control.py); the instructor's time cap is the
    host's."""
    try:
        checked = svc.check(order.form())
    except EngineError as err:
        st.session_state["tpk_error"] = str(err)
        return
    st.session_state["tpk_error"] = None
    st.session_state["tpk_result"] = None
    freeze_heap()  # the server's heap out of Streamlit's forced full collections (serving/heap.py)
    job = svc.submit(checked, order.label, hold=True)
    watch_session(job)
    st.session_state["tpk_job"] = job
    wok = order.wok_tokens or int(svc.about.get("token_budget") or 0)  # the wok's size this order cooks in
    st.session_state["tpk_run"] = LiveRun.for_order(uuid.uuid4().hex, checked.prompt_tokens, wok)  # drawn before the cook


def release_cook() -> None:
    """The last call of the page: the order starts only once the page has been drawn.

    Both views then give the browser SETTLE_S to paint what pressing Cook changed before the
    engine starts (the wait is queue time, not TTFT or TPOT). The live view used to start at once
    because the settle measured worse there; that was Streamlit's full garbage collection after
    each fragment rerun landing in the cook (see serving/heap.py), and with that gone the
    settle keeps the Cook rerun's paint out of the measurement for the live view too.

    With the live view off, the page then waits for the order without refreshing (the wait holds
    no lock the engine needs) and reruns once when it is done, so nothing in this process competes
    with the engine while it is measured.
    """
    job = st.session_state.get("tpk_job")
    if job is None:
        return
    live = st.session_state[K_LIVE] if K_LIVE in st.session_state else live_view_default()
    job.release(settle_s=SETTLE_S)  # let the browser paint the Cook rerun first (measured)
    if not job.finished and not live:
        quiet_wait(job, QUIET_WAIT_S)  # a Cancel click still interrupts the wait
        st.rerun()


def draw_live(svc: HostClient, presenter: bool, wok_capacity: int) -> None:
    """Panels, scene and outcome, in one fragment that follows an order while it is in the kitchen.

    Everything that changes while cooking lives inside this one fragment (the diagnosis too), so
    an update and the page rerun that ends the cooking can never draw over each other's elements;
    the rerun only switches the following off. With a feed the fragment does not tick: the scene
    follows the feed's stream and its `feed` trigger ("done" or "failed: why") reruns the fragment.
    """
    cooking = is_cooking()
    st.html(ART / "live_page.css")  # no stale fade on the live elements (style only: takes no space)
    following = cooking and st.session_state.get(K_LIVE, live_view_default())
    job = st.session_state.get("tpk_job")
    run: LiveRun | None = st.session_state.get("tpk_run")
    feed = follow_feed(svc, job, run, presenter, wok_capacity) if following else None

    @st.fragment(run_every=TICK_S if following and feed is None else None)
    def live():
        if job is not None and run is not None:
            run.consume(job.events)
            if not following:
                draw_queue_place(svc, job)  # followed live, the scene's panels say the place in line
        values = panel_values(run)
        # The panels' place: above the kitchen, or in presenter mode below it (on a projector the
        # kitchen keeps its place on the first screen whatever the panels hold).
        above = st.container()
        data = None
        if job is not None and run is not None and run.batch:
            data = live_feed.live_scene_data(
                svc,
                job,
                run,
                presenter=presenter,
                wok_capacity=wok_capacity,
                panels=values if following and not values.final else None,
            )
            data["feed"] = {"url": live_feed.stream_url(feed)} if feed else None
            data["quiet"] = cooking and not following  # the scene says it replays once done
        said = draw_scene(data)
        with st.container() if presenter else above:
            if following and not values.final:
                # The panels are drawn inside the scene while cooking (one element updated, not two);
                # this empty element keeps their place so the scene stays the same element.
                st.empty()
            else:
                draw_panels(values, live_feed.waited_s(job), presenter)
                if values.final:
                    draw_timeline(run, live_feed.waited_s(job))  # the order to scale: where E2E went
        draw_outcome(svc.info.device, svc.info.precision)
        if feed and str(said or "").startswith("failed"):
            st.session_state[K_FEED_FAILED] = str(said)
            st.rerun()  # follow this order (and the session's next ones) with the fragment's ticks
        if cooking and job is not None and job.finished:
            st.rerun()  # stop following: the order is done and drawn

    live()


def follow_feed(
    svc: HostClient, job, run: LiveRun | None, presenter: bool, wok_capacity: int
) -> str | None:
    """The URL path of the job's feed, opened once per job; None where the server has no feed
    route or this session's scene could not read one (the fragment's ticks then follow the order)."""
    if job is None or run is None or not live_feed.serving() or st.session_state.get(K_FEED_FAILED):
        return None
    held = st.session_state.get(K_FEED)
    if held is not None and held[0] is job:
        return held[1]
    url = live_feed.open_feed(svc, job, run, presenter=presenter, wok_capacity=wok_capacity)
    st.session_state[K_FEED] = (job, url)
    return url


def draw_queue_place(svc: HostClient, job) -> None:
    if job.status in ("queued", "loading"):
        st.info(live_feed.wait_line(svc, job))


__all__ = ["draw_failed_order", "draw_live", "draw_loading", "release_cook", "start_cook"]
