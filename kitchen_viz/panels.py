"""The serving dashboard's two panels: TTFT (the wok) and TPOT / tokens per second (the pot).

Why two panels: a slow first token and a slow stream of tokens have different causes and
different fixes, so a serving dashboard never averages them into one "latency". While a Cook
runs the panels show what the events have measured so far; once it is done they show the
engine's own metrics (`GenerationResult.metrics`, vLLM's definitions in engine/trace.py).

Worked example: first token at 0.040 s, then tokens at 0.052, 0.063, 0.075 s:
TTFT 40.0 ms; ITL [12, 11, 12] ms; TPOT (0.075 - 0.040) / 3 = 11.7 ms; E2E 75.0 ms.
A one-token order has no decode step: its TPOT and tokens/s are "—", not 0.

Layout: each panel is a wrapping row (Streamlit's horizontal container), so on a 1024 px
projector or in presenter mode a number that does not fit moves to the next line instead of
being drawn over its neighbour or cut to "…" (tests/test_layout_browser.py measures this).

Under the panels, `timeline_segments` draws the order to scale: where TTFT went (the engine's
setup, the wok's pass, sampling the first token from prefill's logits) and the pot's share of E2E,
so the drawing's wok time and the panels' TTFT visibly add up instead of disagreeing.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go
import streamlit as st

from kitchen_viz.charts import legible
from kitchen_viz.timeline import LiveRun
from kitchen_viz.wok_passes import tosses_words
from lab.units import fmt_s, fmt_tps, reused_words


@dataclass(frozen=True)
class PanelValues:
    ttft_s: float | None = None
    tpot_s: float | None = None
    decode_tps: float | None = None  # generated tokens per second over the decode phase, all tables
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    final: bool = False  # True once these are the engine's own metrics
    reused: str = ""  # "N of M prompt tokens reused from leftovers (not cooked)", or "" when every token was cooked
    wok: str = ""  # the wok's tosses: live, which toss and how many tables have a first bowl; done, why it took several
    ttft_label: str = "TTFT"  # with several tables: "TTFT, every table" (the last table's first bowl, live and done)


def ttft_label(batch: int) -> str:
    """One quantity under one name, live and done: an order's TTFT ends when its last table gets its first bowl."""
    return "TTFT, every table" if batch > 1 else "TTFT"


def panel_values(run: LiveRun | None) -> PanelValues:
    """The panels' numbers: the engine's metrics when done, else what the events measured so far.

    With no decode step (a one-token order) TPOT and tokens/s were never measured: None ("—"),
    where the engine's metrics hold 0.0 as a placeholder."""
    if run is None:
        return PanelValues()
    reused = reused_words(run.reused, sum(run.prompt_tokens))
    label = ttft_label(run.batch)
    if run.result is not None:
        m = run.result.metrics
        itl = list(m.itl_s)
        decoded = bool(itl)
        return PanelValues(
            m.ttft_s,
            m.tpot_s if decoded else None,
            m.decode_tps if decoded and m.decode_tps else None,
            m.e2e_s,
            itl,
            final=True,
            reused=reused,
            wok=run.wok_why,
            ttft_label=label,
        )
    itl = run.itl_s
    if run.t_first_token is None:  # the wok is still on (maybe some tables already have a first bowl)
        return PanelValues(wok=run.wok_live, ttft_label=label)
    tpot = sum(itl) / len(itl) if itl else None
    tps = run.batch / tpot if tpot else None  # every running table gets one token per step
    return PanelValues(run.t_first_token, tpot, tps, None, itl, reused=reused, wok=run.wok_why, ttft_label=label)


# A label or a number in the panels wraps rather than ending in "…" (Streamlit truncates metric
# labels to one line): "Tokens/s, all tables" must be readable whole on a projector.
PANELS_CSS = """<style>
.st-key-tpk-panels [data-testid="stMetricLabel"] p,
.st-key-tpk-panels [data-testid="stMetricLabel"] div { white-space: normal; overflow: visible; text-overflow: clip; }
.st-key-tpk-panels [data-testid="stMetricValue"] > div { overflow: visible; text-overflow: clip; white-space: nowrap; }
</style>"""


def draw_panels(values: PanelValues, queue_wait_s: float | None = None, presenter: bool = False) -> None:
    """The two always-visible panels (wok | pot) plus E2E, with the ITL of every step as a chart."""
    note = "" if values.final else " (so far)"
    st.html(PANELS_CSS)
    with st.container(horizontal=True, gap="medium", key="tpk-panels"):
        with st.container(border=True, key="tpk-panel-wok"):
            st.markdown(":material/local_fire_department: **The wok · prefill**")
            with st.container(horizontal=True, gap="medium"):
                st.metric(
                    values.ttft_label,
                    fmt_s(values.ttft_s),
                    width="content",
                    help="Time to first token: request start to the first output token of every table (the "
                    "wok's passes plus the engine's setup and sampling the first token from prefill's logits). "
                    "With several tables it ends when the last table gets its first bowl, live and when done.",
                )
                st.metric(
                    "E2E",
                    fmt_s(values.e2e_s),
                    width="content",
                    help="The whole order: request start to the last token of the last table.",
                )
            if values.wok:
                st.caption(f":material/cyclone: {values.wok}", help="The wok's size (tokens one pass holds) is a "
                           "control of the order form: a smaller wok takes more tosses.")
            if values.reused:
                st.caption(f":material/recycling: {values.reused}: TTFT is shorter than cooking them would take")
            if queue_wait_s:
                st.caption(f"waited {fmt_s(queue_wait_s)} in line first (not part of TTFT)")
        with st.container(border=True, key="tpk-panel-pot"):
            st.markdown(":material/soup_kitchen: **The soup pot · decode**")
            with st.container(horizontal=True, gap="medium"):
                steps = f", mean of {len(values.itl_s):,} step{'s' if len(values.itl_s) != 1 else ''}" if values.itl_s else ""
                st.metric(
                    "TPOT" + (steps if values.final else note),
                    fmt_s(values.tpot_s),
                    width="content",
                    help="Time per output token: (E2E − TTFT) / (tokens − 1). A one-token order has no "
                    "decode step, so no TPOT.",
                )
                st.metric("Tokens/s, all tables" + (", mean" if values.final else note), fmt_tps(values.decode_tps),
                          width="content")
                if values.itl_s and not values.final:  # while cooking: a number, not a chart
                    st.metric("Latest ITL", fmt_s(values.itl_s[-1]), width="content")
            if values.itl_s and values.final:
                st.plotly_chart(itl_figure(values.itl_s, presenter), width="stretch", config={"displayModeBar": False})
            elif values.final:
                st.caption("No decode step: the only token of each table came from the wok's pass.")
            elif not values.itl_s:
                st.caption("The ITL of every decode step appears here once the pot starts ladling.")


def itl_figure(itl_s: list[float], presenter: bool = False) -> go.Figure:
    """A small bar chart: one bar per decode step, its inter-token latency in ms (legible type: charts.legible)."""
    ms = [x * 1e3 for x in itl_s]
    fig = go.Figure(go.Bar(x=list(range(1, len(ms) + 1)), y=ms, marker_color="#2a9d8f", name="ITL"))
    fig.update_layout(title="ITL per decode step (ms)", height=260 if presenter else 220, bargap=0.15)
    fig.update_xaxes(showgrid=False)
    fig.update_yaxes(rangemode="tozero")
    return legible(fig, presenter, legend=False)


# -- the order to scale: where E2E went ---------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    key: str  # setup | wok | first | pot
    label: str
    seconds: float
    color: str


def timeline_segments(run: LiveRun | None) -> list[Segment]:
    """E2E cut into its measured parts, in engine seconds since the request started.

    setup  request start -> the wok's pass starts (batching, allocating the KV cache)
    wok    the prefill forward pass (what the drawing's wok timer shows)
    first  the wok's pass ended -> the first token (sampled from prefill's logits): TTFT ends here
    pot    first token -> the last token (the decode steps): E2E ends here

    Example: pass 0.002-0.034 s, first token 0.035 s, E2E 0.263 s ->
    setup 2.0 ms, wok 32.0 ms, first 1.0 ms, pot 228.0 ms (setup + wok + first = TTFT 35 ms).
    Empty until the order is done (the parts of an unfinished order do not add up yet).
    """
    if run is None or run.result is None or run.t_prefill_start is None or run.t_prefill_end is None:
        return []
    m = run.result.metrics
    start, end = run.t_prefill_start, run.t_prefill_end
    parts = [
        Segment("setup", "setup", max(0.0, start), "#9aa3ad"),
        Segment("wok", "wok's pass (prefill)", max(0.0, end - start), "#f2661b"),
        Segment("first", "first token sampled", max(0.0, m.ttft_s - end), "#f6b73c"),
        Segment("pot", "soup pot (decode)", max(0.0, m.e2e_s - m.ttft_s), "#2a9d8f"),
    ]
    return parts


SHORT_NAMES = {"setup": "setup", "wok": "wok", "first": "1st token", "pot": "pot"}


def timeline_html(
    segments: list[Segment], steps: int, queue_wait_s: float | None = None, scale_s: float | None = None,
    tosses: str = "", restarts: Sequence[tuple[float, int]] = (),
) -> str:
    """One bar, to scale, with each part's measured time; the words under it add TTFT up.

    `scale_s` draws the bar as a share of a longer time (two orders compared on one scale);
    `tosses` says how many passes the wok took and why, when it took several (kitchen_viz/wok_passes.py);
    `restarts` (t, tokens served) marks where the engine process restarted under the order."""
    total = sum(s.seconds for s in segments)
    if total <= 0:
        return ""
    width = 100.0 if not scale_s or scale_s <= total else 100.0 * total / scale_s
    by = {s.key: s for s in segments}
    ttft = by["setup"].seconds + by["wok"].seconds + by["first"].seconds
    cells = []
    for s in segments:
        share = s.seconds / total
        title = html.escape(f"{s.label}: {fmt_s(s.seconds)} ({share:.1%} of E2E)")
        # Inside the bar only a short name, and only where it fits whole (the words below name every part):
        # a 30 % segment of the narrowest content column (about 340 px at 1024 px) holds "wok 24.00 ms".
        inner = html.escape(f"{SHORT_NAMES[s.key]} {fmt_s(s.seconds)}") if share >= 0.3 else ""
        cells.append(
            f'<div class="tpk-tl-seg tpk-tl-{s.key}" style="flex:{share * 100:.4f} 1 0;background:{s.color}" '
            f'title="{title}"><span>{inner}</span></div>'
        )
    decode = by["pot"].seconds
    step_words = f"{steps:,} decode step{'s' if steps != 1 else ''}" if steps else "no decode step"
    words = (
        f"<b>TTFT {fmt_s(ttft)}</b> = setup {fmt_s(by['setup'].seconds)} + "
        f"wok's {'passes' if tosses else 'pass'} {fmt_s(by['wok'].seconds)}{f' ({html.escape(tosses)})' if tosses else ''} "
        f"+ first token sampled from prefill's logits {fmt_s(by['first'].seconds)} · "
        f"<b>soup pot {fmt_s(decode)}</b> ({step_words}, {decode / total:.0%} of E2E) · "
        f"<b>E2E {fmt_s(total)}</b>"
    )
    if queue_wait_s:
        words += f" · before all this the order waited {fmt_s(queue_wait_s)} in line (not in TTFT or E2E)"
    marks = "".join(
        f'<div class="tpk-tl-restart" style="left:{min(100.0, 100.0 * t / total):.2f}%" '
        f'title="{html.escape(restart_words(t, kept))}"></div>' for t, kept in restarts
    )  # fmt: skip
    words += "".join(f" · <b>{html.escape(restart_words(t, kept))}</b>" for t, kept in restarts)
    return (
        "<style>"
        ".tpk-timeline{width:100%}"
        ".tpk-tl{display:flex;height:1.9rem;border-radius:.4rem;overflow:hidden;margin:.2rem 0 .3rem 0}"
        # A part's name shows whole or not at all: a zero-width first item holds the first line, so a
        # name wider than its part wraps to the second line, which the part's height hides (a bar
        # drawn shorter, as in Compare, or presenter mode's larger type, never cuts "pot 118.6 ms").
        ".tpk-tl-seg{min-width:3px;height:1.9rem;display:flex;flex-wrap:wrap;align-content:flex-start;"
        "justify-content:center;overflow:hidden}"
        ".tpk-tl-seg::before{content:'';width:0;height:1.9rem}"
        ".tpk-tl-seg span{color:#1b1b1b;font-size:.8rem;font-weight:700;white-space:nowrap;padding:0 .3rem;"
        "line-height:1.9rem;height:1.9rem}"
        ".tpk-tl-words{font-size:.85rem;line-height:1.4}"
        ".tpk-tl-at{position:relative}"
        ".tpk-tl-restart{position:absolute;top:-.25rem;bottom:-.25rem;width:0;border-left:3px dashed #c0392b}"
        "</style>"
        f'<div class="tpk-timeline" aria-label="the order to scale">'
        f'<div class="tpk-tl-title" style="font-weight:700">The order to scale: prefill vs decode share of E2E</div>'
        f'<div class="tpk-tl-at" style="width:{width:.2f}%"><div class="tpk-tl">{"".join(cells)}</div>{marks}</div>'
        f'<div class="tpk-tl-words">{words}</div></div>'
    )


def draw_timeline(run: LiveRun | None, queue_wait_s: float | None = None) -> None:
    """The timeline bar under the panels, once the order is done (nothing before)."""
    segments = timeline_segments(run)
    if segments:
        steps = len(run.result.metrics.itl_s) if run is not None and run.result is not None else 0
        tosses = "; ".join(w for w in (tosses_words(run.tosses), run.wok_why) if w) if run is not None else ""
        st.html(timeline_html(segments, steps, queue_wait_s, tosses=tosses, restarts=run.restarts))


def restart_words(t: float, kept: int) -> str:
    """Example: restart_words(0.84, 48) -> "the engine process restarted at 840.0 ms; the order went on from its 48 tokens"."""
    return f"the engine process restarted at {fmt_s(t)}; the order went on from its {kept:,} tokens"
