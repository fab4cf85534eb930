"""The Kitchen page's pieces: the order form, the live view, the diagnosis.

`*_ui()` functions draw widgets and return what the learner chose; `draw_*()` functions only
render. While an order cooks in the live view, the scene (one component, which redraws only what
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
    tpk_job     the Job on the shared kitchen's queue (serving.service)
    tpk_run     the LiveRun folded from that job's events (kitchen_viz.timeline)
    tpk_feed    (job, URL path) of the job's feed, while the live view follows it
    tpk_feed_failed  why the scene could not read its feed (the session then uses ticks)
    tpk_result  after a Cook: {"texts", "ttft_s", "tpot_s", "e2e_s", "decode_tps"} (measured)
    tpk_error   the one-line reason the last order was refused, if it was
"""

from __future__ import annotations

import gc
import os
import uuid

import streamlit as st

from engine.errors import EngineError
from kitchen_viz import live_feed
from kitchen_viz.app_state import REPO
from kitchen_viz.compare import draw_compare
from kitchen_viz.order_control import (
    draw_shared_stove,
    is_cancelled,
    order_caps,
    quiet_wait,
    refuse_over_caps,
    time_limit,
    watch_session,
)
from kitchen_viz.orders import (
    DEFAULT_PROMPT,
    Order,
    control_limits,
    cook,
    prompt_ceiling,
    reply_ceiling,
    tighter,
)
from kitchen_viz.panels import draw_panels, draw_timeline, panel_values
from kitchen_viz.scene import ART, draw_scene
from kitchen_viz.timeline import LiveRun
from kitchen_viz.whole_class import draw_whole_class
from serving.service import SETTLE_S, KitchenService

ROOFLINE_PAGE = "pages/lab_roofline.py"
LESSONS_PAGE = "pages/lessons.py"
TICK_S = 0.25  # how often the live view looks for new events while an order cooks
K_MODE, K_TEXT, K_PLEN, K_BATCH, K_NEW, K_TEMP = (
    "tpk_mode",
    "tpk_text",
    "tpk_prompt_len",
    "tpk_batch",
    "tpk_new",
    "tpk_temp",
)
MODES = ("Generated prompt of N tokens", "Write a prompt")
K_LIVE = "tpk_live"
K_FEED, K_FEED_FAILED = "tpk_feed", "tpk_feed_failed"
LIVE_VIEW_MIN_CORES = 4
QUIET_WAIT_S = 600  # the longest a page waits, without refreshing, for an order it is not watching


def draw_loading(svc: KitchenService) -> None:
    """While the worker reads the weights: say what is loading, then rerun once it is ready."""
    st.session_state[K_FORM_HIDDEN] = True  # the order form (and its live toggle) is not drawn now

    @st.fragment(run_every=0.5)
    def wait():
        if svc.state == "loading":
            st.info(f"⏳ {svc.loading_message}…", icon="🍳")
        else:
            st.rerun()

    wait()


# A shared link can preset the order: ?prompt=32&batch=4&new=16&temp=0.7 (applied once per session).
# A value outside the controls' limits is moved inside them and the page says which way and why,
# exactly as when a control moves (see `clamp_state`).
QUERY_KEYS = {
    "prompt": (K_PLEN, int),
    "batch": (K_BATCH, int),
    "new": (K_NEW, int),
    "temp": (K_TEMP, float),
    "live": (K_LIVE, lambda v: v not in ("0", "false", "no")),
}
K_FROM_URL = "tpk_from_url"  # {session key: "?name=value"} for values the link set, until first shown
K_LIVE_KEEP = "tpk_live_keep"  # the learner's live-view choice, kept while the toggle is not drawn
K_FORM_HIDDEN = "tpk_form_hidden"  # set while the loading page stands in for the order form
URL_ORDER = {K_PLEN: "prompt", K_BATCH: "batch", K_NEW: "new", K_TEMP: "temp"}


def apply_query_params() -> None:
    """Seed the order form from the URL once, so an instructor can hand out a ready-made order.

    A link from the lesson plan (`?lesson=N&...`, pages/lessons.py) applies again in a session that
    already applied one: each lesson's marker is applied once."""
    lesson = st.query_params.get("lesson")
    if st.session_state.get("tpk_query_applied") and lesson in (None, st.session_state.get("tpk_lesson")):
        return
    st.session_state["tpk_query_applied"] = True
    st.session_state["tpk_lesson"] = lesson
    if lesson is not None and "prompt" in st.query_params:
        st.session_state[K_MODE] = MODES[0]  # a lesson's prompt is a generated one of N tokens
    st.session_state[K_FROM_URL] = {}
    for name, (key, kind) in QUERY_KEYS.items():
        if name in st.query_params:
            raw = st.query_params[name]
            try:
                value = kind(raw)
            except ValueError:
                st.warning(f"Ignored ?{name}={raw}: not a number.")
                continue
            st.session_state[key] = value
            st.session_state[K_FROM_URL][key] = f"?{name}={raw}"
            if key == K_LIVE:
                st.session_state[K_LIVE_KEEP] = value


def keep_order_in_url() -> None:
    """Write the order's current values to the address bar, so a reload (or a copied link) keeps it."""
    for key, name in URL_ORDER.items():
        if key in st.session_state:
            value = st.session_state[key]
            text = f"{value:g}" if isinstance(value, float) else str(value)
            if st.query_params.get(name) != text:
                st.query_params[name] = text


def live_view_default() -> bool:
    """Live by default where it measured inside the 3 % TPOT budget; quiet (wait, then replay)
    elsewhere. The toggle overrides either way.

    Against the quiet view on a 2-core machine (docs/benchmarks/ui-overhead.md), the live view
    following the feed's stream (what `two-pot-kitchen` serves) stays inside the 3 % TPOT budget;
    updated through fragment reruns (plain `streamlit run app.py`) it does not, so there it is the
    default only with 4 or more cores, where the browser need not share the engine's.
    """
    return live_feed.serving() or (os.cpu_count() or 1) >= LIVE_VIEW_MIN_CORES


def clamp_state(key: str, default, low, high) -> str | None:
    """A widget's value kept inside its (changing) range: "raised", "lowered", or None if it fit."""
    value = st.session_state.get(key, default)
    clamped = min(max(value, low), high)
    st.session_state[key] = clamped
    if clamped == value:
        return None
    return "raised" if clamped > value else "lowered"


def say_clamped(key: str, what: str, moved: str | None, value, why_low: str, why_high: str) -> None:
    """One warning naming the value's source (the link's ?name=value, or the control), the
    direction it moved and the limit that moved it. Example: "?batch=0 raised to 1: an order needs
    at least one table."."""
    source = st.session_state.get(K_FROM_URL, {}).get(key)
    if moved is None:
        return
    shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
    st.warning(f"{source or what} {moved} to {shown}: {why_low if moved == 'raised' else why_high}.")


SLIDER_MAX = 4096  # above this a slider cannot be set to one token: the control becomes a number box


def count_control(label: str, low: int, high: int, key: str, help: str) -> int:
    """A slider for ranges a hand can set precisely; a number box (typed, or stepped) beyond that."""
    if high - low <= SLIDER_MAX:
        return st.slider(label, low, max(low + 1, high), key=key, help=help)
    return st.number_input(label, min_value=low, max_value=high, step=1, key=key, help=help)


def order_ui(svc: KitchenService, seed: int) -> Order | None:
    """The order form: three columns of controls, then the Cook row. Returns an Order when Cook
    was pressed (`start_cook` has the engine check it).

    Every ceiling comes from the engine (`Engine.limits`: context and KV budget), and a control
    never offers an order that cannot cook (orders.reply_ceiling / prompt_ceiling); a value that no
    longer fits after another control moved (or that a link asked for) is moved inside, and the
    reason is shown. A refused written prompt keeps every control in place (Cook disabled), so the
    layout does not jump while the learner fixes it.
    """
    ctx = svc.info.max_context
    apply_query_params()
    prompt_col, batch_col, new_col = st.columns([5, 4, 4], gap="medium")
    caps = order_caps()  # the instructor's caps: the controls stop there too, not only Cook's check
    with new_col:
        new_cap, new_reason = tighter(
            *reply_ceiling(svc.limits, ctx),
            caps.max_new_tokens,
            f"the instructor's limit is {caps.max_new_tokens:,} new tokens per order",
        )
        moved = clamp_state(K_NEW, min(64, new_cap), 1, new_cap)
        max_new = count_control(
            "Max new tokens (bowls per table)",
            1,
            new_cap,
            K_NEW,
            help=f"Up to {new_cap:,}: {new_reason}.",
        )
        say_clamped(K_NEW, "Max new tokens", moved, max_new, "a table gets at least one token", new_reason)
        moved = clamp_state(K_TEMP, 0.0, 0.0, 2.0)
        temperature = st.slider(
            "Temperature", 0.0, 2.0, step=0.05, key=K_TEMP, help="0 = greedy (always the likeliest token)."
        )
        say_clamped(
            K_TEMP, "Temperature", moved, temperature, "0 is greedy, the lowest", "2 is the highest offered"
        )
    with prompt_col:
        text, plen = prompt_ui(svc, max_new, caps.max_order_tokens)
    refusal = None
    with batch_col:
        if text is not None:
            if not text.strip():
                refusal = "the prompt is empty (only spaces or line breaks): write at least one word"
            else:
                try:
                    plen = len(svc.check([text], max_new)[0])
                except EngineError as err:
                    refusal = str(err)
            if refusal:
                st.error(f"Refused: {refusal}")
                plen = 1  # the batch control stays in place, at the limits of the shortest prompt
            else:
                st.caption(f"Your prompt is {plen:,} tokens.")
        lim = control_limits(svc.limits(plen, max_new), plen, max_new)
        most, why = tighter(
            lim.max_batch,
            lim.batch_reason,
            caps.max_order_tokens // max(1, plen),
            f"the instructor's limit is {caps.max_order_tokens:,} prompt tokens per order, all tables "
            f"together, and each table orders {plen:,}",
        )
        moved = clamp_state(K_BATCH, 1, 1, most)
        batch = st.slider("Tables ordering at once (batch size)", 1, max(2, most), key=K_BATCH)
        st.caption(f"Up to {most:,}: {why}.")
        say_clamped(K_BATCH, "Batch", moved, batch, "an order needs at least one table", why)
    with st.container(horizontal=True, vertical_alignment="center", gap="medium", key="tpk-cook-row"):
        pressed = st.button(
            "🔥 Cook", type="primary", disabled=is_cooking() or refusal is not None, key="tpk-cook"
        )
        # The toggle's state is dropped by any run that does not draw it (the loading page after a
        # model or precision switch), and the default may not be what this session showed (it is
        # decided by modules a file change reloads): what the toggle showed last is kept instead.
        # (Measured in Chromium: after the loading page the toggle's state came back *False*, not
        # missing, so the kept value is restored whenever the form was hidden, not only when absent.)
        if st.session_state.pop(K_FORM_HIDDEN, False) or K_LIVE not in st.session_state:
            st.session_state[K_LIVE] = st.session_state.get(K_LIVE_KEEP, live_view_default())
        st.session_state[K_LIVE_KEEP] = st.toggle(
            "Live view",
            key=K_LIVE,
            help="On: the panels and the kitchen update 4× a second while the engine cooks, then the "
            "kitchen replays the order in slow motion. The engine runs in its own process and the kitchen "
            "follows its own stream of updates, so watching costs the pot little (measured on a 2-core CPU under "
            "`two-pot-kitchen`: TPOT +0.6 % on average against the quiet view; the budget is 3 %). Off: the page waits quietly and "
            "replays the order when it is done.",
        )
        if (REPO / LESSONS_PAGE).is_file():
            st.page_link(LESSONS_PAGE, label="Suggested orders (lesson plan)", icon="📋")
    st.session_state[K_FROM_URL] = {}  # a link's values are explained once; later moves are the controls'
    keep_order_in_url()
    if not pressed or refusal is not None:
        return None
    return Order(
        batch, max_new, temperature, seed, text=text, prompt_tokens=None if text is not None else plen
    )


def prompt_ui(
    svc: KitchenService, max_new: int, order_tokens: int | None = None
) -> tuple[str | None, int | None]:
    """A written prompt (text, None) or a generated one of N tokens (None, N)."""
    mode = st.radio("Prompt", MODES, key=K_MODE, horizontal=True, label_visibility="collapsed")
    if mode == MODES[1]:
        text = st.text_area("Prompt text (every table orders this)", DEFAULT_PROMPT, key=K_TEXT, height=90)
        return text, None
    cap, reason = tighter(
        *prompt_ceiling(svc.limits, svc.info.max_context, max_new),
        order_tokens,
        f"the instructor's limit is {order_tokens:,} prompt tokens per order, all tables together"
        if order_tokens
        else "",
    )
    moved = clamp_state(K_PLEN, min(32, cap), 1, cap)
    plen = count_control(
        "Prompt length (tokens per table)",
        1,
        cap,
        K_PLEN,
        help="Each table's order is this many tokens of kitchen verse, cut at a different line.",
    )
    st.caption(f"Up to {cap:,}: {reason}.")
    say_clamped(K_PLEN, "Prompt length", moved, plen, "a prompt has at least one token", reason)
    return None, plen


def is_cooking() -> bool:
    job = st.session_state.get("tpk_job")
    return job is not None and not job.finished


def freeze_server_heap() -> None:
    """Keep what the server already holds out of the full garbage collections Streamlit forces.

    Streamlit runs `gc.collect(2)` after every script run, each fragment rerun of the live view
    included (`runner.postScriptGC`). With torch, plotly and the app loaded, py-spy measured each
    of those at 0.3-1 s of the server's CPU: during a live Cook the server's core stayed busy, so
    the browser's work went to the engine's core. `gc.freeze()` moves every object alive now to
    the permanent generation, so later collections walk only what was created since (measured:
    0.21 s for the first Cook's collect and freeze, 7 ms for the next). The price: cyclic garbage
    among objects alive at a freeze is never reclaimed. Called once per Cook, before the order is
    released, so none of it overlaps the measurement.
    """
    gc.collect()
    gc.freeze()


def start_cook(svc: KitchenService, order: Order) -> None:
    """Queue the order on the shared kitchen and start a fresh timeline for it.

    The timeline starts with the order's tables (their prompts' token counts, as the engine
    counts them), so the scene's first drawing of tickets and tables is part of the Cook rerun
    the browser paints before the engine starts; measured, that first drawing was the largest
    raster burst at a live tick (docs/benchmarks/ui-overhead.md). The engine's own validation
    runs first, once, then the instructor's caps (serving/caps.py): a refused order never joins
    the queue and its reason is shown instead. The order's time cap becomes the job's time limit,
    and the job is watched: closing or reloading the page cancels it (order_control.py)."""
    caps = order_caps()
    try:
        ids = svc.check(
            order.prompts(svc), order.max_new_tokens, temperature=order.temperature, seed=order.seed
        )
        refuse_over_caps(caps, ids, order.max_new_tokens)
    except EngineError as err:
        st.session_state["tpk_error"] = str(err)
        return
    st.session_state["tpk_error"] = None
    st.session_state["tpk_result"] = None
    tables = [len(prompt) for prompt in ids]
    freeze_server_heap()
    job = svc.submit(cook(order), order.label, hold=True, **time_limit(caps))
    watch_session(job)
    st.session_state["tpk_job"] = job
    st.session_state["tpk_run"] = LiveRun.for_order(uuid.uuid4().hex, tables)  # tables drawn before the cook


def release_cook() -> None:
    """The last call of the page: the order starts only once the page has been drawn.

    Both views then give the browser SETTLE_S to paint what pressing Cook changed before the
    engine starts (the wait is queue time, not TTFT or TPOT). The live view used to start at once
    because the settle measured worse there; that was Streamlit's full garbage collection after
    each fragment rerun landing in the cook (see `freeze_server_heap`), and with that gone the
    settle keeps the Cook rerun's paint out of the measurement for the live view too.

    With the live view off, the page then waits for the order without refreshing (the wait holds
    no lock the engine needs) and reruns once when it is done, so nothing in this process competes
    with the engine while it is measured.
    """
    job = st.session_state.get("tpk_job")
    if job is None:
        return
    live = st.session_state.get(K_LIVE, live_view_default())
    job.release(settle_s=SETTLE_S)  # let the browser paint the Cook rerun first (measured)
    if not job.finished and not live:
        quiet_wait(job, QUIET_WAIT_S)  # a Cancel click still interrupts the wait
        st.rerun()


def draw_live(svc: KitchenService, presenter: bool, wok_capacity: int) -> None:
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
        if following and not values.final:
            # The panels are drawn inside the scene while cooking (one element updated, not two);
            # this empty element keeps their place so the scene stays the same element.
            st.empty()
        else:
            draw_panels(values, live_feed.waited_s(job))
            if values.final:
                draw_timeline(run, live_feed.waited_s(job))  # the order to scale: where E2E went
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
        draw_outcome(svc.info.device, svc.info.precision)
        if feed and str(said or "").startswith("failed"):
            st.session_state[K_FEED_FAILED] = str(said)
            st.rerun()  # follow this order (and the session's next ones) with the fragment's ticks
        if cooking and job is not None and job.finished:
            st.rerun()  # stop following: the order is done and drawn

    live()


def follow_feed(
    svc: KitchenService, job, run: LiveRun | None, presenter: bool, wok_capacity: int
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


def draw_queue_place(svc: KitchenService, job) -> None:
    if job.status in ("queued", "loading"):
        st.info(live_feed.wait_line(svc, job))


def finish_cook(job, run: LiveRun | None) -> None:
    """Keep the measured outcome in session state once per job (the page and the tests read it)."""
    if st.session_state.get("tpk_finished") is job:
        return
    st.session_state["tpk_finished"] = job
    if job.error is not None:
        st.session_state["tpk_error"] = job.error
        return
    if run is not None:
        run.consume(job.events)
    m = job.result.metrics
    read_board = getattr(job._service, "board", None)  # a kitchen server: the class around this order
    st.session_state["tpk_board"] = read_board(job.order_id) if read_board and job.order_id else None
    st.session_state["tpk_result"] = {
        "texts": list(job.result.texts),
        "ttft_s": m.ttft_s,
        "tpot_s": m.tpot_s,
        "e2e_s": m.e2e_s,
        "decode_tps": m.decode_tps,
    }
    keep_for_comparison(job, run)


def keep_for_comparison(job, run: LiveRun | None) -> None:
    """This session's finished orders, kept for 'Compare two orders' (kitchen_viz.compare)."""
    from kitchen_viz.app_state import current_settings
    from kitchen_viz.compare import keep, kept_order

    number = st.session_state["tpk_order_no"] = st.session_state.get("tpk_order_no", 0) + 1
    here = current_settings()
    keep(kept_order(run, number, here.model, here.dtype, live_feed.waited_s(job)))


def draw_outcome(device: str, dtype: str) -> None:
    """After a Cook: why it failed (one line: a refusal, a stopped or hung engine), or the
    diagnosis and the full text of each table."""
    job = st.session_state.get("tpk_job")
    if job is not None and job.finished:
        finish_cook(job, st.session_state.get("tpk_run"))
    error = st.session_state.get("tpk_error")
    if error:
        st.error(failure_line(error))
        return
    if job is None or not job.finished or job.result is None:
        return
    draw_shared_stove(job)
    draw_diagnosis(job.result, device, dtype)
    board = st.session_state.get("tpk_board")
    if board is not None:
        m = job.result.metrics
        draw_whole_class(board, m.ttft_s, m.tpot_s if m.output_tokens > len(job.result.tokens) else None,
                         "kitchen", rail=True)  # fmt: skip
    with st.expander("Full text, table by table", expanded=False):
        for i, text in enumerate(job.result.texts, start=1):
            st.markdown(f"**Table {i}**")
            st.code(text or "(no text)", language=None, wrap_lines=True)
    draw_compare()  # the session's last orders, two side by side


def failure_line(error: str) -> str:
    if is_cancelled(error):  # "cancelled: you pressed Cancel", "cancelled after 30 s: ..."
        return f"🛑 Order {error}."
    return f"The kitchen could not cook this order: {error}"


def draw_failed_order() -> None:
    """While the kitchen reloads its engine (after the child died or was stopped as hung), this
    session's failed order still says why, in the same one line the finished page shows."""
    job = st.session_state.get("tpk_job")
    if job is not None and job.finished and job.error:
        st.error(failure_line(job.error))


def measured_tpot_by_dtype(result) -> dict[str, float]:
    """This server's measured TPOT per dtype for the result's model, device and batch (the run log),
    so the inspector's dtype advice follows this machine, not a rule of thumb."""
    try:
        from kitchen_viz.app_state import current_settings, run_log
        from lab.runlog import tpot_by_dtype

        here = current_settings()  # the names the kitchen records its orders under
        return tpot_by_dtype(run_log().frame(), here.model, here.device, len(result.tokens))
    except Exception:  # noqa: BLE001 -- no log (a bare page) or an older row shape: nothing measured
        return {}


def draw_diagnosis(result, device: str, dtype: str) -> None:
    """One line naming the slower pot, from the lab's inspector, with the numbers it used.

    With a roofline the Lab has measured on this machine (same device and dtype), the inspector
    can also say whether the pot is bandwidth- or compute-bound; without one it says it cannot.
    """
    try:
        from lab.cache import latest_roof
        from lab.inspector import diagnose
    except ImportError:
        return
    roof = latest_roof(device, dtype)
    verdict = diagnose(
        result.metrics, result.trace, roof, dtype=dtype, dtype_tpot=measured_tpot_by_dtype(result)
    )
    st.info(f"🩺 **Diagnosis:** {verdict.headline}")
    with st.expander("Why, and what would help"):
        for line in verdict.evidence:
            st.markdown(f"- {line}")
        for line in verdict.fixes:
            st.markdown(f"- **Try:** {line}")
        if roof is None and (REPO / ROOFLINE_PAGE).is_file():
            st.page_link(ROOFLINE_PAGE, label="Measure this machine's roofline in the Lab", icon="📈")


__all__ = ["draw_failed_order", "draw_live", "draw_loading", "order_ui", "release_cook", "start_cook"]
