"""Plotly figures for the monitoring dashboard (the lab's experiments draw their own: see lab/).

Each experiment's figures live in its module in `lab/` (one place per experiment); the palette and
helpers they share are `lab.plot_kit`, re-exported here for the dashboard and for callers that
already read them from this module.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from lab.plot_kit import (  # noqa: F401  (re-exported: the shared kit)
    GREY,
    GUESS,
    LABEL_POSITIONS,
    LAYOUT,
    POT,
    WOK,
    finish,
    guess_marker,
    label_log_axes,
    log_ticks,
    series,
    tick_text,
)

CHART_FONT_PX = 16  # the smallest text any Kitchen or Dashboard chart draws


def titled(fig: go.Figure, title: str) -> go.Figure:
    """The title, the template and readable log axes; `legible` then lays the text out. (The lab's
    `finish` lays its charts out its own way, for its own widths: one layout per chart.)"""
    fig.update_layout(title=title, **LAYOUT)
    label_log_axes(fig)
    return fig

PRESENTER_CHART_FONT_PX = 20  # presenter mode: read from the back of the room


def legible(fig: go.Figure, presenter: bool = False, legend: bool = True) -> go.Figure:
    """Every text of the chart at least CHART_FONT_PX, each in its own band: the title at the top
    left of the figure, the legend in one band under it (above the plot, never on the x-axis title
    or its ticks), the axes' titles and ticks given room by plotly's automargin.

    The top margin is sized for the title and the legend's rows as a chart NARROWEST_PX wide wraps
    them, computed from the font size, so presenter mode's larger type keeps the bands apart too."""
    size = PRESENTER_CHART_FONT_PX if presenter else CHART_FONT_PX
    title_band = 10 + 1.5 * (size + 2)
    legend_band = legend_rows(fig, size) * (1.5 * size + 8) + 6 if legend else 0
    fig.update_layout(
        font=dict(size=size),
        title=dict(font=dict(size=size + 2), x=0, xref="container", xanchor="left", y=1, yref="container",
                   yanchor="top", pad=dict(t=8, l=8)),
        legend=dict(orientation="h", x=0, xanchor="left", y=1.02, yref="paper", yanchor="bottom",
                    font=dict(size=size), title=None),
        showlegend=legend,
        margin=dict(l=10, r=24, t=int(title_band + legend_band + 8), b=10),
    )  # fmt: skip
    # The tick labels stand off their axes, so the corner's first x tick and the y axis's "0" stay apart.
    fig.update_xaxes(automargin=True, tickfont=dict(size=size), ticklabelstandoff=6,
                     title=dict(font=dict(size=size), standoff=8))
    fig.update_yaxes(automargin=True, tickfont=dict(size=size), ticklabelstandoff=10,
                     title=dict(font=dict(size=size), standoff=8))
    fig.update_annotations(font=dict(size=size))
    return fig


NARROWEST_PX = 520  # the narrowest a Kitchen or Dashboard chart is drawn (1024 px, sidebar open)


def legend_rows(fig: go.Figure, size: int) -> int:
    """How many rows the legend takes at NARROWEST_PX: each entry's text (about 0.55 em a character)
    plus its symbol and gap. Example: three entries of 20, 29 and 23 characters at 16 px -> 2 rows."""
    names = [t.name for t in fig.data if t.name and t.showlegend is not False]
    width = sum(len(n) * 0.55 * size + 48 for n in names)
    return max(1, -(-int(width) // NARROWEST_PX))


def time_axis(fig: go.Figure, times) -> None:
    """A clock axis in UTC: hours and minutes on the ticks (and seconds for a span under five minutes,
    so no two ticks read the same), the date once in the axis title (plotly's own date line under
    the first tick was cut off at the chart's edge)."""
    day = f" on {pd.Timestamp(min(times)).strftime('%-d %b %Y')}" if len(times) else ""
    short = len(times) and pd.Timestamp(max(times)) - pd.Timestamp(min(times)) < pd.Timedelta(minutes=5)
    fig.update_xaxes(title=f"time (UTC){day}", tickformat="%H:%M:%S" if short else "%H:%M", nticks=6)


# The slow tail of each metric: for a time the high percentiles, for a rate the low ones.
SLOW_TAIL = {
    "time": (("p50", "p50 (median)", POT), ("p90", "p90 (slowest 10 %)", "#f0a202"), ("p99", "p99 (slowest 1 %)", WOK)),
    "rate": (("p50", "p50 (median)", POT), ("p10", "p10 (slowest 10 %)", "#f0a202"), ("p1", "p1 (slowest 1 %)", WOK)),
}  # fmt: skip


def percentile_figure(frame, column: str, title: str, unit_scale: float = 1.0, unit: str = "ms", *,
                      rate: bool = False, presenter: bool = False) -> go.Figure:  # fmt: skip
    """The median and the slow tail of `column` over a trailing window, one line each, plus each run
    as a dot. For a rate (`rate=True`: tokens/s) the slow tail is the low percentiles (lab.monitoring
    `rates`), and the legend says which end each line is."""
    fig = go.Figure()
    if len(frame):
        fig.add_trace(
            go.Scatter(
                x=frame.wall_time,
                y=frame[column] * unit_scale,
                mode="markers",
                name="each run",
                marker=dict(color=GREY, size=7),
            )
        )
        for q, name, colour in SLOW_TAIL["rate" if rate else "time"]:
            col = f"{column}_{q}"
            if col in frame:
                fig.add_trace(series(frame.wall_time, frame[col] * unit_scale, name, colour, mode="lines"))
    fig.update_yaxes(title=unit, rangemode="tozero")
    time_axis(fig, frame.wall_time if len(frame) else [])
    return legible(titled(fig, title), presenter)


def rate_figure(per_minute, title: str = "Requests per minute", presenter: bool = False) -> go.Figure:
    # One bar per wall-clock minute; on a date axis a bar's width is in milliseconds.
    fig = go.Figure(
        go.Bar(x=per_minute.index, y=per_minute.values, marker_color=POT, width=0.8 * 60_000, offset=0)
    )
    fig.update_yaxes(title="requests", rangemode="tozero", dtick=1 if (per_minute.max() if len(per_minute) else 0) <= 8 else None)
    time_axis(fig, per_minute.index)
    fig.update_xaxes(dtick=60_000 * max(1, len(per_minute) // 6))
    if len(per_minute):  # keep a few minutes of context around the bars, so one bar is not a wall
        pad = pd.Timedelta(minutes=2)
        fig.update_xaxes(
            range=[per_minute.index.min() - pad, per_minute.index.max() + pad + pd.Timedelta(minutes=1)]
        )
    return legible(titled(fig, title), presenter, legend=False)


def kv_memory_figure(frame, presenter: bool = False) -> go.Figure:
    """Peak live KV cache of each run next to what its cache allocated."""
    fig = go.Figure()
    if len(frame):
        fig.add_trace(
            go.Scatter(
                x=frame.wall_time,
                y=frame.kv_allocated_mb,
                mode="markers",
                name="allocated",
                marker=dict(color=GREY, symbol="square-open", size=8),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=frame.wall_time,
                y=frame.kv_cache_mb,
                mode="markers",
                name="live (peak)",
                marker=dict(color=POT, size=8),
            )
        )
    fig.update_yaxes(title="MB", rangemode="tozero")
    time_axis(fig, frame.wall_time if len(frame) else [])
    return legible(titled(fig, "KV cache memory per run (the serving counter)"), presenter)
