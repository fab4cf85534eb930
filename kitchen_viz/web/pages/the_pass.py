"""The pass: the instructor's view of a class kitchen server, read from its /metrics.

The pass is where a head chef watches every plate leave. This page scrapes a kitchen server's
Prometheus metrics every few seconds (our class kitchen, or a vLLM server: the same
names), keeps the scrapes of the last minutes in this session, and shows what the class is
doing to the kitchen right now: orders running and waiting, KV memory, TTFT and ITL percentiles
over a window, tokens per second, and the caps in force. A llama.cpp server (`llama-server
--metrics`) exports its own names and no latency histograms: the page shows what it has and says
in one line what it does not. Logic: serving/clients/scrape.py.
"""

from __future__ import annotations

import time

import httpx
import pandas as pd
import streamlit as st

from engine.errors import EngineError
from kitchen_viz import icons
from kitchen_viz.app_state import KEY_PRESENTER, class_kitchen_address
from kitchen_viz.class_pages import not_reachable, orders_figure, where_the_class_kitchen_is
from serving.clients.scrape import scrape, window

KEY_URL, KEY_SCRAPES = "pass-url", "pass-scrapes"
WINDOWS = {"last 30 s": 30, "last minute": 60, "last 5 minutes": 300}
KEEP_S = 600  # scrapes older than this are dropped
EVERY_S = 2.0

st.title(f"{icons.THE_PASS} The pass: the whole class's kitchen")
address, known_key = class_kitchen_address()
st.caption(f"{where_the_class_kitchen_is(address)} Every number here is read from the server's own /metrics.")
default_url = st.session_state.get(KEY_URL, address)
url = st.text_input("Kitchen server", value=default_url, key=KEY_URL)
api_key = st.text_input("API key (only if the server was started with one)", type="password",
                        value=known_key)  # fmt: skip
span = st.radio("Window", list(WINDOWS), horizontal=True, index=1)


def ms(v) -> str:
    return "—" if v is None else f"{v * 1e3:,.1f} ms"


@st.fragment(run_every=EVERY_S)
def live_pass() -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # /kitchen needs the key when the server has one
    scrapes = st.session_state.setdefault(KEY_SCRAPES, {})
    history = scrapes.setdefault(url, [])
    try:
        history.append(scrape(url, api_key or None))
    except EngineError as err:
        st.error(f"{err}. {not_reachable(url)}")
        return
    now = time.time()
    history[:] = [s for s in history if now - s.t <= KEEP_S]
    base = next((s for s in history if now - s.t <= WINDOWS[span]), history[0])
    w = window(base, history[-1])
    note = st.empty()  # one slot, filled or not, so the elements below keep their places between runs
    if len(history) < 2:
        note.info("First reading taken; the rates and percentiles need a second one, a couple of seconds from now.")
    cols = st.columns(4)
    cols[0].metric("Orders cooking (running)", f"{w.running:,.0f}")
    cols[1].metric("Orders waiting for a seat", f"{w.waiting:,.0f}")
    cols[2].metric("KV memory in use", "—" if w.kv_usage is None else f"{w.kv_usage:.0%}")
    cols[3].metric("Tokens per second", f"{w.tokens_per_s:,.1f}")
    if not w.histograms:
        st.info(f"This server's /metrics ({history[-1].prefix} names) has no latency histograms and no count of "
                "finished orders: TTFT, ITL and TPOT percentiles cannot be read here (the Order page measures them "
                "at the client).")  # fmt: skip
    else:
        show_latencies(w, span)
    seconds = [round(s.t - now, 1) for s in history]
    running = [int(s.gauges.get("num_requests_running", 0)) for s in history]
    waiting = [int(s.gauges.get("num_requests_waiting", 0)) for s in history]
    st.plotly_chart(orders_figure(seconds, running, waiting, bool(st.session_state.get(KEY_PRESENTER))),
                    width="stretch", key="pass-orders")  # fmt: skip
    try:
        about = httpx.get(url.rstrip("/") + "/kitchen", headers=headers, timeout=3).json()
        st.markdown(f"**Kitchen**: {about['model']} on {about['device']} ({about['dtype']}), policy "
                    f"`{about['policy']}`, {about['seats']} seats. {about['caps_line']}")  # fmt: skip
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        st.caption("This server does not report its policy or caps (not a Two-Pot kitchen server).")


def show_latencies(w, span: str) -> None:
    st.markdown(f"**Over the {span} ({w.seconds:,.0f} s of readings)**: "
                f"{w.observed['time_to_first_token_seconds']:,.0f} first tokens, "
                f"{w.observed['inter_token_latency_seconds']:,.0f} token gaps, {w.requests_per_s or 0:,.2f} orders/s finished.")  # fmt: skip
    table = pd.DataFrame(
        {name: [ms(d["p50"]), ms(d["p90"]), ms(d["p99"])] for name, d in
         (("TTFT (the wok)", w.ttft_s), ("ITL (the pot)", w.itl_s), ("TPOT", w.tpot_s),
          ("queue", w.queue_s), ("E2E", w.e2e_s))},
        index=["p50", "p90", "p99"],
    )  # fmt: skip
    st.table(table)
    st.caption("Percentiles come from the server's histogram buckets filled during the window (interpolated "
               "inside a bucket, as Prometheus' histogram_quantile does).")  # fmt: skip


live_pass()
