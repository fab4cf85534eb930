"""The Kitchen page's hold on a running order: the instructor's caps, Cancel, and a closed page.

Why a module of its own: the order form (kitchen_ui.py) says what a learner may order; this says
what happens to an order once it is in the kitchen, which the serving side enforces
(serving/caps.py, serving/job.py) and the page only words and wires up:

  caps      `order_caps()` reads the instructor's file (`two-pot-kitchen --caps caps.toml`) for the
            controls' ceilings; the kitchen's host enforces them (serving/host/host.py), the time
            cap included (an order past it ends in one line);
  Cancel    `draw_cancel` shows the button while this session's order waits or cooks; the job
            leaves the stove's line, or its tables leave the batch at the next step
            (serving/host_client.py);
  page gone Streamlit has no "session ended" callback, so `watch_session` hands the job a probe,
            "is this browser session still connected?" (Streamlit's runtime, thread-safe), which
            the kitchen's watcher asks every second: a page closed or reloaded for ABANDON_S
            has its order cancelled (a brief reconnect does not);
  stove     `draw_shared_cores` says when something else used the engine's cores while the order
            was measured (what an order waits for, the stove included: live_feed.wait_line).
"""

from __future__ import annotations

import re

import streamlit as st

from engine.errors import EngineError
from serving.caps import Caps, load_caps

K_JOB = "tpk_job"
K_CANCEL = "tpk_cancel"


def order_caps() -> Caps:
    """The instructor's caps (a broken file was refused by the launcher; here it falls back to the
    defaults and says why, once per run)."""
    try:
        return load_caps()
    except EngineError as err:
        st.error(f"Caps file: {err}; using the default caps.")
        return Caps()


def session_alive_probe():
    """A thread-safe "is this browser session still connected?" for the current session, or None
    where there is no server runtime (AppTest, a bare script)."""
    from streamlit import runtime  # lazy: the server runtime exists only under `streamlit run`
    from streamlit.runtime.scriptrunner import get_script_run_ctx  # lazy: as above

    ctx = get_script_run_ctx(suppress_warning=True)
    if ctx is None or not runtime.exists():
        return None
    rt, session_id = runtime.get_instance(), ctx.session_id
    return lambda: rt.is_active_session(session_id)


def watch_session(job) -> None:
    """Have the kitchen cancel `job` once this page has been closed or reloaded."""
    probe = session_alive_probe()
    if probe is not None:
        job.watch(probe)


def cancel_order() -> None:
    job = st.session_state.get(K_JOB)
    if job is not None and not job.finished:
        job.cancel()


def draw_cancel(slot) -> None:
    """In `slot` (always drawn, so the elements after it keep their place): the Cancel button
    while this session's order waits or cooks."""
    job = st.session_state.get(K_JOB)
    with slot:
        if job is not None and not job.finished:
            st.button(
                "Cancel",
                icon=":material/cancel:",
                key=K_CANCEL,
                on_click=cancel_order,
                help="Stop this order: a waiting order leaves the line; a cooking one stops its engine work.",
            )


def is_cancelled(error: str | None) -> bool:
    return bool(error) and error.startswith("cancelled")


def draw_shared_cores(job, load: float | None = None, cores: int | None = None) -> None:
    """One line when something else used the engine's cores while this order was measured: the
    kitchen's own note (another order shared the passes), and the machine's load when other
    programs kept more cores busy than it has (`busy_line`)."""
    note = getattr(job, "shared_cores", None)
    if note:
        st.warning(f"Measured while the stove was shared: {note}.")
    busy = busy_line(load, cores)
    if busy:
        st.caption(f":material/speed: {busy}")


def busy_line(load: float | None, cores: int | None) -> str:
    """The machine's load (the 1-minute average of runnable programs) when it exceeded its cores, in
    words; "" otherwise. Example: busy_line(6.6, 2) -> "This machine was busy while the order cooked:
    load 6.6 on 2 cores, so other programs shared them and these times may be slower than usual"."""
    if load is None or not cores or load <= cores:
        return ""
    return (f"This machine was busy while the order cooked: load {load:.1f} on {cores} cores, so other "
            "programs shared them and these times may be slower than usual")  # fmt: skip


def quiet_wait(job, seconds: float, tick_s: float = 1.0) -> None:
    """Wait for `job` without redrawing, yet let a click (Cancel) interrupt the wait.

    A Streamlit script only sees a rerun request at a yield point (an `st.*` call that sends
    something), so once a `tick_s` an empty placeholder is refreshed; a click then restarts the
    script with the button pressed."""
    spot = st.empty()
    waited = 0.0
    while not job.wait(tick_s) and waited < seconds:
        waited += tick_s
        spot.empty()


def is_cooking() -> bool:
    """This session's order is on the kitchen's queue or cooking (Cook is disabled meanwhile)."""
    job = st.session_state.get("tpk_job")
    return job is not None and not job.finished


HTTP_PREFIX = re.compile(r"^HTTP \d{3}: ")


def plain_line(error: str) -> str:
    """A refusal as a teacher reads it: the kitchen server's status code goes (the engineer's
    details keep it). Example: "HTTP 400: prompt 1 is 12,399 tokens; ..." -> "prompt 1 is 12,399 tokens; ..."."""
    return HTTP_PREFIX.sub("", error.strip()).rstrip(".")


def say_refused(error: str) -> None:
    """One plain sentence for a refused order, with the raw line under "Engineer's details"."""
    st.error(f"This order can't be cooked: {plain_line(error)}.", icon=":material/block:")
    if plain_line(error) != error.strip().rstrip("."):
        with st.expander("Engineer's details"):
            st.code(error, language=None, wrap_lines=True)
