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


def percentile_figure(frame, column: str, title: str, unit_scale: float = 1.0, unit: str = "ms") -> go.Figure:
    """p50/p90/p99 of `column` over a trailing window, one line each, plus each run as a dot."""
    fig = go.Figure()
    if len(frame):
        fig.add_trace(
            go.Scatter(
                x=frame.wall_time,
                y=frame[column] * unit_scale,
                mode="markers",
                name="each run",
                marker=dict(color=GREY, size=5),
            )
        )
        for q, colour in (("p50", POT), ("p90", "#f0a202"), ("p99", WOK)):
            col = f"{column}_{q}"
            if col in frame:
                fig.add_trace(series(frame.wall_time, frame[col] * unit_scale, q, colour, mode="lines"))
    fig.update_yaxes(title=unit, rangemode="tozero")
    fig.update_xaxes(title="time (UTC)")
    return finish(fig, title)


def rate_figure(per_minute, title: str = "Requests per minute") -> go.Figure:
    # One bar per wall-clock minute; on a date axis a bar's width is in milliseconds.
    fig = go.Figure(
        go.Bar(x=per_minute.index, y=per_minute.values, marker_color=POT, width=0.8 * 60_000, offset=0)
    )
    fig.update_yaxes(title="requests", rangemode="tozero")
    fig.update_xaxes(title="minute (UTC)", tickformat="%H:%M", dtick=60_000)
    if len(per_minute):  # keep a few minutes of context around the bars, so one bar is not a wall
        pad = pd.Timedelta(minutes=2)
        fig.update_xaxes(
            range=[per_minute.index.min() - pad, per_minute.index.max() + pad + pd.Timedelta(minutes=1)]
        )
    return finish(fig, title)


def kv_memory_figure(frame) -> go.Figure:
    """Peak live KV cache of each run next to what its cache allocated."""
    fig = go.Figure()
    if len(frame):
        fig.add_trace(
            go.Scatter(
                x=frame.wall_time,
                y=frame.kv_allocated_mb,
                mode="markers",
                name="allocated",
                marker=dict(color=GREY, symbol="square-open"),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=frame.wall_time,
                y=frame.kv_cache_mb,
                mode="markers",
                name="live (peak)",
                marker=dict(color=POT),
            )
        )
    fig.update_yaxes(title="MB", rangemode="tozero")
    fig.update_xaxes(title="time (UTC)")
    return finish(fig, "KV cache memory per run (the serving counter)")
