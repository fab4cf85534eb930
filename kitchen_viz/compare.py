"""Compare two orders side by side: the session's last orders kept, pick two, see both kitchens.

Why: the lessons are comparisons (prompt 32 against 448, 1 table against 32), and remembering
one order's numbers while cooking the next is what a class cannot do. Each finished order is kept
as the numbers the engine measured (nothing recomputed or estimated), at most KEEP of them per
browser session; both bars are drawn on the scale of the longer E2E, so their lengths compare.

Example: kept = [a (prompt 32, E2E 0.26 s), b (prompt 448, E2E 0.41 s)] -> two columns, a's bar
63 % as long as b's, TTFT / TPOT / tokens/s / E2E above each.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from kitchen_viz.panels import Segment, panel_values, timeline_html, timeline_segments
from kitchen_viz.timeline import LiveRun
from lab.units import fmt_s, fmt_tps

KEEP = 8
K_HISTORY = "tpk_history"


@dataclass(frozen=True)
class KeptOrder:
    label: str
    ttft_s: float
    tpot_s: float | None  # None: no decode step
    decode_tps: float | None
    e2e_s: float
    steps: int
    segments: list[Segment]
    queue_wait_s: float | None


def kept_order(
    run: LiveRun, number: int, model: str, dtype: str, queue_wait_s: float | None
) -> KeptOrder | None:
    """What is kept of a finished order (None if it has no result)."""
    if run is None or run.result is None:
        return None
    values = panel_values(run)
    prompt = sorted(set(run.prompt_tokens))
    plen = f"{prompt[0]:,}" if len(prompt) == 1 else f"{min(prompt):,}-{max(prompt):,}"
    new = max((len(t) for t in run.result.tokens), default=0)
    tables = f"{run.batch} table{'s' if run.batch != 1 else ''}"
    return KeptOrder(
        label=f"#{number}: prompt {plen} × {tables}, {new} new · {model} ({dtype})",
        ttft_s=values.ttft_s or 0.0,
        tpot_s=values.tpot_s,
        decode_tps=values.decode_tps,
        e2e_s=values.e2e_s or 0.0,
        steps=len(values.itl_s),
        segments=timeline_segments(run),
        queue_wait_s=queue_wait_s,
    )


def keep(order: KeptOrder | None) -> None:
    """Add a finished order to this session's history (the newest last, at most KEEP)."""
    if order is None:
        return
    history = st.session_state.setdefault(K_HISTORY, [])
    history.append(order)
    del history[:-KEEP]


def draw_compare() -> None:
    """The comparison, once the session has two finished orders."""
    history: list[KeptOrder] = st.session_state.get(K_HISTORY, [])
    if len(history) < 2:
        return
    with st.expander(f":material/compare_arrows: Compare two orders (the last {len(history)} of this session)", expanded=False):
        labels = [o.label for o in history]
        left, right = st.columns(2, gap="medium")
        picked = [
            left.selectbox("First order", labels, index=len(labels) - 2, key="tpk-compare-a"),
            right.selectbox("Second order", labels, index=len(labels) - 1, key="tpk-compare-b"),
        ]
        orders = [history[labels.index(p)] for p in picked]
        scale = max(o.e2e_s for o in orders)
        for col, order in zip((left, right), orders, strict=True):
            with col:
                with st.container(horizontal=True, gap="medium"):
                    st.metric("TTFT", fmt_s(order.ttft_s), width="content")
                    st.metric("TPOT", fmt_s(order.tpot_s), width="content")
                    st.metric("Tokens/s, all tables", fmt_tps(order.decode_tps), width="content")
                    st.metric("E2E", fmt_s(order.e2e_s), width="content")
                if order.segments:
                    st.html(timeline_html(order.segments, order.steps, order.queue_wait_s, scale_s=scale))
        st.caption("Both bars are drawn on the scale of the longer E2E: their lengths compare directly.")
