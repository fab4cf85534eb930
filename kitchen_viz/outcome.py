"""After a Cook: the measured outcome kept for the session, the diagnosis, or why it failed.

`draw_outcome()` is drawn inside the live view's fragment (kitchen_ui.draw_live), so the page
rerun that ends the cooking and the diagnosis can never draw over each other.

Session state it keeps: tpk_result (the order's measured metrics), tpk_error (the one-line
reason an order was refused or failed), tpk_board (the class around the order, on a kitchen
server), tpk_order_no (the session's count of finished orders).
"""

from __future__ import annotations

import os

import streamlit as st

from kitchen_viz import live_feed
from kitchen_viz.app_state import current_settings, run_log
from kitchen_viz.compare import draw_compare, keep, kept_order
from kitchen_viz.lab_page_kit import page_target
from kitchen_viz.order_control import draw_shared_cores, is_cancelled, plain_line
from kitchen_viz.timeline import LiveRun
from kitchen_viz.whole_class import draw_whole_class
from lab.cache import latest_roof
from lab.inspector import diagnose
from lab.runlog import tpot_by_dtype

ROOFLINE_PAGE = "lab_roofline"  # the roofline experiment's page (kitchen_viz/lab_page_kit.py)


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
    st.session_state["tpk_load"] = machine_load()  # the 1-minute load as the order finished
    st.session_state["tpk_result"] = {
        "texts": list(job.result.texts),
        "ttft_s": m.ttft_s,
        "tpot_s": m.tpot_s,
        "e2e_s": m.e2e_s,
        "decode_tps": m.decode_tps,
    }
    keep_for_comparison(job, run)


def machine_load() -> float | None:
    """The machine's 1-minute load average (None where the OS does not say)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # Windows has no load average
        return None


def keep_for_comparison(job, run: LiveRun | None) -> None:
    """This session's finished orders, kept for 'Compare two orders' (kitchen_viz.compare)."""
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
        st.error(failure_line(error), icon=":material/block:")
        return
    if job is None or not job.finished or job.result is None:
        return
    draw_shared_cores(job, st.session_state.get("tpk_load"), os.cpu_count())
    draw_diagnosis(job.result, device, dtype)
    board = st.session_state.get("tpk_board")
    if board is not None:
        m = job.result.metrics
        draw_whole_class(board, m.ttft_s, m.tpot_s if m.output_tokens > len(job.result.tokens) else None,
                         "kitchen", rail=True, presenter=current_settings().presenter)  # fmt: skip
    with st.expander("Full text, table by table", expanded=False):
        for i, text in enumerate(job.result.texts, start=1):
            st.markdown(f"**Table {i}**")
            st.code(text or "(no text)", language=None, wrap_lines=True)
    draw_compare()  # the session's last orders, two side by side


def failure_line(error: str) -> str:
    """One plain sentence: a cancelled order, or why the kitchen could not cook it (no status codes)."""
    if is_cancelled(error):  # "cancelled: you pressed Cancel", "cancelled after 30 s: ..."
        return f"Order {error}."
    return f"The kitchen could not cook this order: {plain_line(error)}."


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
        here = current_settings()  # the names the kitchen records its orders under
        return tpot_by_dtype(run_log().frame(), here.model, here.device, len(result.tokens))
    except Exception:  # noqa: BLE001 -- no log (a bare page) or an older row shape: nothing measured
        return {}


def draw_diagnosis(result, device: str, dtype: str) -> None:
    """One line naming the slower pot (past the inspector's stated margin; else "balanced"), with
    the numbers it used, the same ones the panels show.

    With a roofline the Lab has measured on this machine (same device and dtype), the inspector
    can also say whether the pot is bandwidth- or compute-bound; without one it says it cannot.
    An order that started from leftovers says how many prompt tokens it reused.
    """
    roof = latest_roof(device, dtype)
    verdict = diagnose(
        result.metrics, result.trace, roof, dtype=dtype, dtype_tpot=measured_tpot_by_dtype(result),
        reused=getattr(result, "reused_tokens", 0), prompt_tokens=sum(result.prompt_tokens),
    )  # fmt: skip
    st.info(f"**Diagnosis:** {verdict.headline}", icon=":material/stethoscope:")
    with st.expander("Why, and what would help"):
        for line in verdict.evidence:
            st.markdown(f"- {line}")
        for line in verdict.fixes:
            st.markdown(f"- **Try:** {line}")
        if roof is None and (roofline := page_target(ROOFLINE_PAGE)) is not None:
            st.page_link(roofline, label="Measure this machine's roofline in the Lab", icon=":material/speed:")
