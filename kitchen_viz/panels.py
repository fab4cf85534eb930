"""The serving dashboard's two panels: TTFT (the wok) and TPOT / tokens per second (the pot).

Why two panels: a slow first token and a slow stream of tokens have different causes and
different fixes, so a serving dashboard never averages them into one "latency". While a Cook
runs the panels show what the events have measured so far; once it is done they show the
engine's own metrics (`GenerationResult.metrics`, vLLM's definitions in engine/trace.py).

Worked example: first token at 0.040 s, then tokens at 0.052, 0.063, 0.075 s:
TTFT 40.0 ms; ITL [12, 11, 12] ms; TPOT (0.075 - 0.040) / 3 = 11.7 ms; E2E 75.0 ms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go
import streamlit as st

from kitchen_viz.timeline import LiveRun


@dataclass(frozen=True)
class PanelValues:
    ttft_s: float | None = None
    tpot_s: float | None = None
    decode_tps: float | None = None  # generated tokens per second over the decode phase, all tables
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    final: bool = False  # True once these are the engine's own metrics


def panel_values(run: LiveRun | None) -> PanelValues:
    """The panels' numbers: the engine's metrics when done, else what the events measured so far."""
    if run is None:
        return PanelValues()
    if run.result is not None:
        m = run.result.metrics
        return PanelValues(m.ttft_s, m.tpot_s, m.decode_tps, m.e2e_s, list(m.itl_s), final=True)
    itl = run.itl_s
    if run.t_first_token is None:
        return PanelValues()
    tpot = sum(itl) / len(itl) if itl else None
    tps = run.batch / tpot if tpot else None  # every running table gets one token per step
    return PanelValues(run.t_first_token, tpot, tps, None, itl)


def fmt_s(seconds: float | None) -> str:
    """Milliseconds below a second (two decimals below 100 ms), seconds above; a dash when not measured."""
    if seconds is None:
        return "—"
    if seconds < 0.1:
        return f"{seconds * 1e3:,.2f} ms"
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def fmt_tps(tps: float | None) -> str:
    return "—" if not tps else f"{tps:,.0f} tok/s"


def draw_panels(values: PanelValues, queue_wait_s: float | None = None) -> None:
    """The two always-visible panels (wok | pot) plus E2E, with the ITL of every step as a chart."""
    note = "" if values.final else " (so far)"
    wok, pot = st.columns([2, 4], border=True)
    with wok:
        st.markdown("**🔥 The wok · prefill**")
        a, b = st.columns(2)
        a.metric(
            "TTFT", fmt_s(values.ttft_s), help="Time to first token: request start to the first output token."
        )
        b.metric(
            "E2E",
            fmt_s(values.e2e_s),
            help="The whole order: request start to the last token of the last table.",
        )
        if queue_wait_s:
            st.caption(f"waited {fmt_s(queue_wait_s)} in line first")
    with pot:
        st.markdown("**🍲 The soup pot · decode**")
        a, b, c = st.columns([1, 1, 2])
        a.metric(
            "TPOT" + note, fmt_s(values.tpot_s), help="Time per output token: (E2E − TTFT) / (tokens − 1)."
        )
        b.metric("Tokens/s, all tables" + note, fmt_tps(values.decode_tps))
        with c:
            if values.itl_s and values.final:
                st.plotly_chart(itl_figure(values.itl_s), width="stretch", config={"displayModeBar": False})
            elif values.itl_s:  # while cooking: a number, not a chart (building charts would slow the pot)
                st.metric("Latest ITL", fmt_s(values.itl_s[-1]))
            else:
                st.caption("The ITL of every decode step appears here once the pot starts ladling.")


def itl_figure(itl_s: list[float]) -> go.Figure:
    """A small bar chart: one bar per decode step, its inter-token latency in ms."""
    ms = [x * 1e3 for x in itl_s]
    fig = go.Figure(go.Bar(x=list(range(1, len(ms) + 1)), y=ms, marker_color="#2a9d8f", name="ITL"))
    fig.update_layout(
        height=120,
        margin=dict(l=0, r=0, t=20, b=0),
        title=dict(text="ITL per decode step (ms)", font=dict(size=12), x=0),
        xaxis=dict(title=None, showgrid=False),
        yaxis=dict(title=None, rangemode="tozero"),
        showlegend=False,
        bargap=0.15,
    )
    return fig
