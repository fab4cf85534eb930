"""The lab's plotting kit: palette, layout and the small helpers every experiment's figures share.

Why here, in `lab/` and not beside the pages: each experiment module draws its own figures (one
place per experiment), and `kitchen_viz` (the dashboard's figures) imports this one-way. Plotly
only, no Streamlit.

The guess is drawn as a hollow star labelled "your guess" at the place the measurement it predicts
will land, so the two sit side by side on the same axes. Colours follow the kitchen: the wok
(prefill) is flame orange, the soup pot (decode) broth teal, the guess violet. Every figure's
numbers come from a result; nothing is drawn from constants.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

WOK, POT, GUESS, GREY = "#e4572e", "#17a2a2", "#7b3fa0", "#8c8c8c"
MODE_COLOURS = {"static": POT, "growing": "#f0a202", "none": WOK, "padded": WOK, "packed": POT}
# The legend sits under the x-axis title (plotly's default horizontal legend covered it, in the app
# and in the PNG export); the bottom margin leaves room for two rows of legend entries.
LAYOUT = dict(
    template="plotly_white",
    height=500,
    margin=dict(l=60, r=30, t=60, b=140),
    legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0),
)
LABEL_POSITIONS = ("bottom right", "top left", "bottom left", "top right")  # neighbours' labels apart


def guess_marker(x, y, text: str = "your guess") -> go.Scatter:
    return go.Scatter(
        x=[x],
        y=[y],
        mode="markers+text",
        name="your guess",
        text=[text],
        textposition="top center",
        marker=dict(symbol="star-open", size=16, color=GUESS, line=dict(width=2)),
    )


def cpu_time_line(x, y, name: str, colour: str) -> go.Scatter:
    """The process's CPU time under a wall-time curve (dotted): on a busy machine it keeps the shape."""
    return go.Scatter(x=x, y=y, mode="lines", name=name, line=dict(color=colour, dash="dot", width=1))


def series(x, y, name: str, colour: str, mode: str = "lines+markers", dash: str | None = None) -> go.Scatter:
    """One measured curve of a lab chart, in the kitchen's palette (WOK, POT, GREY ...)."""
    return go.Scatter(x=x, y=y, mode=mode, name=name, line=dict(color=colour, dash=dash))


def mark_x(fig: go.Figure, x: float, text: str, log_x: bool) -> None:
    """A dotted vertical marker with a label. On a log axis plotly places annotations (not shapes)
    in log10 units, so the label's x is converted; passing the raw value stretches the axis to 1e128."""
    fig.add_vline(x=x, line_dash="dot", line_color=GREY)
    if text:
        fig.add_annotation(
            x=np.log10(x) if log_x else x,
            y=1,
            yref="paper",
            yanchor="bottom",
            text=text,
            showarrow=False,
            font=dict(color=GREY),
        )


def finish(fig: go.Figure, title: str) -> go.Figure:
    fig.update_layout(title=title, **LAYOUT)
    label_log_axes(fig)
    return fig


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values for a log axis over [lo, hi]: 1-2-5 per decade for up to three decades, else the
    decades alone. Example: (3, 700) -> [5, 10, 20, 50, 100, 200, 500]; (0.1, 1e6) -> [0.1, 1, ..., 1e6].

    Why not plotly's own: on a short log range it labels the minor ticks with their leading digit
    only ("8 9 1 2 3 ... 10 2 3 4"), which a class reads as nonsense."""
    if not (lo > 0 and hi > 0):
        return []
    lo, hi = min(lo, hi), max(lo, hi)
    first, last = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    steps = (1, 2, 5) if last - first <= 3 else (1,)
    ticks = [m * 10.0**k for k in range(first, last + 1) for m in steps]
    inside = [t for t in ticks if lo <= t <= hi]
    if len(inside) < 2:  # a range inside one step: every 1..9 of the decade
        ticks = [m * 10.0**k for k in range(first, last + 1) for m in range(1, 10)]
        inside = [t for t in ticks if lo <= t <= hi] or [ticks[0]]
    return inside


def tick_text(v: float) -> str:
    """1 -> "1", 2000 -> "2k", 5e6 -> "5M", 0.02 -> "0.02"."""
    for unit, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= unit:
            return f"{v / unit:g}{name}"
    return f"{v:g}"


def label_log_axes(fig: go.Figure) -> None:
    """Give every log axis explicit, readable ticks computed from the data drawn on it."""
    for name in [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
        axis = fig.layout[name]
        if axis.type != "log":
            continue
        letter, suffix = name[0], name[5:]
        values = []
        for trace in fig.data:
            if (getattr(trace, f"{letter}axis", None) or letter) != f"{letter}{suffix}":
                continue
            for v in getattr(trace, letter, None) if getattr(trace, letter, None) is not None else []:
                if isinstance(v, (int, float, np.floating, np.integer)) and v is not None and v > 0:
                    values.append(float(v))
        if not values:
            continue
        ticks = log_ticks(min(values), max(values))
        fig.layout[name].update(
            tickvals=ticks, ticktext=[tick_text(t) for t in ticks], minor=dict(showgrid=False)
        )
