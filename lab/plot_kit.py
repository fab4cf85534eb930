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

import math

import numpy as np
import plotly.graph_objects as go

WOK, POT, GUESS, GREY = "#e4572e", "#17a2a2", "#7b3fa0", "#8c8c8c"
MODE_COLOURS = {"static": POT, "growing": "#f0a202", "none": WOK, "padded": WOK, "packed": POT}
LAYOUT = dict(template="plotly_white")
LABEL_POSITIONS = ("bottom right", "top left", "bottom left", "top right")  # neighbours' labels apart


def guess_marker(x, y, text: str = "your guess", textposition: str | None = None) -> go.Scatter:
    """The learner's guess as a hollow star; its words ("your guess: 3x") go in the legend, where
    they cannot land on a bar's value or be cut at the plot's edge. (`textposition` is ignored.)"""
    return go.Scatter(
        x=[x],
        y=[y],
        mode="markers",
        name=text,
        marker=dict(symbol="star-open", size=16, color=GUESS, line=dict(width=2)),
    )


def reference_line(fig: go.Figure, y: float, name: str) -> None:
    """A dotted horizontal line named in the legend (an annotation on the line sat on the data labels)."""
    fig.add_hline(y=y, line_dash="dot", line_color=GREY)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, line=dict(color=GREY, dash="dot")))


def cpu_time_line(x, y, name: str, colour: str) -> go.Scatter:
    """The process's CPU time under a wall-time curve (dotted): on a busy machine it keeps the shape."""
    return go.Scatter(x=x, y=y, mode="lines", name=name, line=dict(color=colour, dash="dot", width=1))


def series(x, y, name: str, colour: str, mode: str = "lines+markers", dash: str | None = None,
           spread: dict | None = None) -> go.Scatter:
    """One measured curve of a lab chart, in the kitchen's palette (WOK, POT, GREY ...); `spread` is
    `lab.noise.error_bars(...)`: each point's range over its repeats, drawn as an error bar."""
    return go.Scatter(x=x, y=y, mode=mode, name=name, line=dict(color=colour, dash=dash), error_y=spread)


# Under zero a y axis may keep this share of its height free, so a value label under the lowest
# point (even one at 0.05) fits inside the plot: a text row is 1.4 x 16 px in presenter mode, 7% of
# the PLOT_PX plot, plus the marker.
LABEL_ROOM = 0.1


def labels_below_too(fig: go.Figure, high: float) -> None:
    """The y axis from -LABEL_ROOM * high to `high`, ticked from 0 in steps of the smallest 1, 2,
    2.5 or 5 x 10^n giving at most 6 steps: a step is over the room, so no tick (and no negative
    number) falls under zero. Example: high 3.9 -> ticks 0, 1, 2, 3; high 1.3 -> every 0.25."""
    scale = 10 ** math.floor(math.log10(high / 6))
    step = next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= high / 6)
    fig.update_yaxes(range=[-LABEL_ROOM * high, high], tick0=0, dtick=step)


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
    return readable(fig)


# -- legible text, kept apart -----------------------------------------------------------------------
# Chart text is drawn by plotly in px, so the page's presenter mode (a larger root font) cannot
# reach it: `readable` sizes it. The layout is computed, not left to plotly's defaults, because
# those put the legend where the x-axis title goes once the text grows: the title (wrapped to the
# narrowest chart) and any label above the plot get their own rows at the top; the tick labels, the
# axis title and the legend (one entry per row, so the row count is known) get theirs at the bottom.
TEXT_PX = 13  # ticks, axis titles, legend, annotations
PRESENTER_TEXT_PX = 16  # legible from the back row of a classroom
LINE = 1.4  # a text row's height, in font sizes
NARROW_PX = 560  # the narrowest a lab chart is drawn (a lab page at 1024 px, the sidebar open)
PLOT_PX = 340  # the plotting area's own height


def wrap(text: str, chars: int) -> list[str]:
    """Split `text` at spaces into lines of at most `chars` characters (a longer word stays whole)."""
    lines: list[str] = []
    for word in text.replace("<br>", " ").split():
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def _wrap_legend(fig: go.Figure, chars: int) -> int:
    """Wrap each legend entry to `chars` per line; returns the legend's rows (one entry per row)."""
    rows, seen = 0, set()
    for t in fig.data:
        if t.showlegend is False or not t.name:
            continue
        lines = wrap(t.name, chars)
        t.name = "<br>".join(lines)
        if t.visible is not False and (t.legendgroup or t.name) not in seen:  # hidden ones take no row
            seen.add(t.legendgroup or t.name)
            rows += len(lines)
    return rows


def _wrap_categories(fig: go.Figure, px: int, width_px: int) -> int:
    """Names on a categorical x-axis ("ITL incl. TTFT") wrapped to the width each one gets, instead
    of side by side over each other; returns how many extra text rows that adds under the plot."""
    names: list[str] = []
    for t in fig.data:
        xs = getattr(t, "x", None)
        if xs is None or not len(xs) or not isinstance(xs[0], str) or (t.xaxis or "x") != "x":
            continue
        names += [x for x in xs if x not in names]
    if not names:
        return 0
    chars = max(4, int((width_px - 110) / len(names) / (0.6 * px)))
    lines = [wrap(n, chars) for n in names]
    fig.layout.xaxis.update(tickmode="array", tickvals=names, ticktext=["<br>".join(ls) for ls in lines],
                            tickangle=0)
    return max(len(ls) for ls in lines) - 1


def readable(fig: go.Figure, presenter: bool = False, width_px: int = NARROW_PX) -> go.Figure:
    """Every text of the chart at `TEXT_PX` (`PRESENTER_TEXT_PX` in presenter mode), in rows that
    cannot overlap: title on top, then labels above the plot; ticks, axis title, legend below.

    Example: a 70-character title in presenter mode wraps to two lines of <= 31 characters, and a
    chart with three legend entries gets three legend rows under its x-axis title."""
    px = PRESENTER_TEXT_PX if presenter else TEXT_PX
    title_px = px + 4
    row = px * LINE
    title = wrap(fig.layout.title.text or "", max(20, int(width_px / (0.56 * title_px))))
    above = any(
        a.yref == "paper" and a.y is not None and a.y >= 1 for a in fig.layout.annotations or ()
    )
    rows = _wrap_legend(fig, max(20, int((width_px - 70) / (0.56 * px))))
    top = 12 + len(title) * title_px * LINE + (row + 8 if above else 0) + 8
    for t in fig.data:
        if not t.name:
            t.showlegend = False  # an unnamed trace would be listed as "trace 0"
    extra = _wrap_categories(fig, px, width_px)
    axis = (2 + extra) * row + 28  # tick labels (wrapped names take more rows) and the x-axis title
    slider = (3 * row + 36) if fig.layout.sliders else 0  # its current value, rail and step labels
    bottom = axis + slider + rows * (row + 4) + 8
    for s in fig.layout.sliders or ():
        s.update(y=-axis / PLOT_PX, yanchor="top", x=0, xanchor="left", len=1, pad=dict(t=0, b=0),
                 font=dict(size=px), currentvalue=dict(font=dict(size=px)))
    fig.update_layout(
        title=dict(text="<br>".join(title), x=12 / width_px, xanchor="left", xref="container",
                   y=1 - (10 + (0.75 * title_px if len(title) > 1 else 0)) / (PLOT_PX + top + bottom),
                   yanchor="top", yref="container",  # plotly lifts a title of several lines by ~3/4 of one
                   font=dict(size=title_px)),
        font=dict(size=px),
        legend=dict(orientation="h", x=0, xanchor="left", xref="container", y=0, yanchor="bottom",
                    yref="container", entrywidth=1, entrywidthmode="fraction", font=dict(size=px),
                    bgcolor="rgba(0,0,0,0)"),
        margin=dict(t=round(top), b=round(bottom), l=20, r=20, autoexpand=True),
        height=round(PLOT_PX + top + bottom),
    )
    fig.update_annotations(font_size=px)
    # ticklabelstandoff: the two axes' "0" labels at a shared origin would touch at the corner.
    fig.update_xaxes(automargin=True, tickfont_size=px, title_font_size=px, title_standoff=8, ticklabelstandoff=4)
    fig.update_yaxes(automargin=True, tickfont_size=px, title_font_size=px, title_standoff=8, ticklabelstandoff=6)
    for t in fig.data:
        if "textfont" in t and t.text is not None:
            t.textfont.size = px
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
    """Give every log axis explicit, readable ticks computed from the data drawn on it, unless the
    figure chose its ticks itself (the batch sizes it measured, say)."""
    for name in [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
        axis = fig.layout[name]
        if axis.type != "log" or axis.tickvals is not None:
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
