"""Plotly figures for the lab's experiments and the monitoring dashboard.

One function per experiment, taking the experiment's result dataclass and the learner's guess
(`None` when they skipped the question). The guess is drawn as a hollow star labelled "your guess"
at the place the measurement it predicts will land, so the two sit side by side on the same axes.

Colours follow the kitchen: the wok (prefill) is flame orange, the soup pot (decode) broth teal,
the guess violet. Every figure's numbers come from the result; nothing is drawn from constants.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

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


# -- 1. big banquet ------------------------------------------------------------------------------


def banquet_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    ttft = go.Figure(series(df.prompt_tokens, df.ttft_s * 1e3, "TTFT (measured)", WOK))
    if result.device == "cpu":
        ttft.add_trace(cpu_time_line(df.prompt_tokens, df.prefill_cpu_s * 1e3, "prefill CPU time", WOK))
    if guess is not None:
        ttft.add_trace(
            guess_marker(
                df.prompt_tokens.iloc[-1], df.ttft_s.iloc[0] * 1e3 * guess, f"your guess: {guess:g}x"
            )
        )
    if result.saturation_tokens:
        mark_x(ttft, result.saturation_tokens, "wok saturated", log_x=True)
    ttft.update_xaxes(title="prompt tokens", type="log")
    ttft.update_yaxes(title="TTFT (ms)", type="log")
    finish(ttft, "The big banquet: time to first token vs prompt length")

    rate = make_subplots(specs=[[{"secondary_y": True}]])
    rate.add_trace(series(df.prompt_tokens, df.prefill_tps, "prefill tokens/s", WOK))
    rate.add_trace(
        series(
            df.prompt_tokens,
            df.attention_share * 100,
            "attention share of FLOPs (analytic, %)",
            GREY,
            mode="lines",
            dash="dash",
        ),
        secondary_y=True,
    )
    if result.saturation_tokens:
        mark_x(rate, result.saturation_tokens, "wok saturated", log_x=True)
    rate.update_xaxes(title="prompt tokens", type="log")
    rate.update_yaxes(title="prefill tokens / s", secondary_y=False)
    rate.update_yaxes(
        title="attention share (%)", secondary_y=True, rangemode="tozero", tickformat=".0f", showgrid=False
    )
    return [ttft, finish(rate, "How fast the wok tosses: prefill tokens/s, and attention's growing share")]


# -- 2. more tables ------------------------------------------------------------------------------


def tables_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    per_token = go.Figure()
    per_token.add_trace(series(df.batch, df.decode_us_per_token, "decode, per token", POT))
    per_token.add_trace(series(df.batch, df.prefill_us_per_token, "prefill, per token", WOK))
    per_token.update_xaxes(title="batch size (sequences)", type="log")
    per_token.update_yaxes(title="time per token (µs)", type="log")
    finish(
        per_token, "Per-token cost vs batch: decode gets cheaper per token, prefill is flat from the start"
    )

    step = make_subplots(specs=[[{"secondary_y": True}]])
    step.add_trace(series(df.batch, df.decode_step_s * 1e3, "decode step (ms)", POT))
    step.add_trace(
        series(df.batch, df.decode_tps, "decode tokens/s", GREY, dash="dash"),
        secondary_y=True,
    )
    if result.device == "cpu":
        step.add_trace(cpu_time_line(df.batch, df.decode_cpu_step_s * 1e3, "decode step CPU time (ms)", POT))
    if guess is not None:
        step.add_trace(
            guess_marker(df.batch.iloc[-1], df.decode_step_s.iloc[0] * 1e3 * guess, f"your guess: {guess:g}x")
        )
    step.update_xaxes(title="batch size (sequences)", type="log")
    step.update_yaxes(title="decode step (ms)", rangemode="tozero", secondary_y=False)
    step.update_yaxes(
        title="tokens / s", rangemode="tozero", secondary_y=True, showgrid=False, tickmode="auto"
    )
    return [finish(step, "More tables: one ladle serves the whole batch, until the pot gets busy"), per_token]


# -- 3. roofline ---------------------------------------------------------------------------------


def roofline_figure(result, guess: float | None = None) -> go.Figure:
    roof, df = result.roof, result.to_frame()
    xs_all = list(df.intensity) + [t.intensity for t in getattr(result, "theory", [])] + [roof.ridge]
    lo, hi = min(xs_all) / 2, max(xs_all) * 2
    xs = np.geomspace(lo, hi, 200)
    fig = go.Figure(
        go.Scatter(
            x=xs,
            y=[roof.attainable(x) / 1e9 for x in xs],
            mode="lines",
            name="roof (measured)",
            line=dict(color="black", width=2),
        )
    )
    for phase, colour in (("prefill", WOK), ("decode", POT)):
        path = [t for t in getattr(result, "theory", []) if t.phase == phase]
        if path:  # the analytic path this phase travels as its knob (prompt length, batch) turns
            knob = "prompt" if phase == "prefill" else "batch"
            fig.add_trace(
                go.Scatter(
                    x=[t.intensity for t in path],
                    y=[t.attainable_flops_per_s / 1e9 for t in path],
                    mode="lines",
                    line=dict(color=colour, width=9),
                    opacity=0.25,
                    name=f"{phase} theory path ({knob} {path[0].setting}-{path[-1].setting})",
                    hovertext=[f"{knob} {t.setting}" for t in path],
                )
            )
        part = df[df.phase == phase].sort_values("intensity")
        # Theory: where the roof says each step could be, joined to its measurement by a dotted drop.
        xs_gap, ys_gap = [], []
        for x, top, got in zip(
            part.intensity, part.attainable_flops_per_s, part.achieved_flops_per_s, strict=True
        ):
            xs_gap += [x, x, None]
            ys_gap += [top / 1e9, got / 1e9, None]
        fig.add_trace(
            go.Scatter(
                x=xs_gap,
                y=ys_gap,
                mode="lines",
                line=dict(color=colour, dash="dot", width=1),
                showlegend=False,
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=part.intensity,
                y=part.attainable_flops_per_s / 1e9,
                mode="markers",
                name=f"{phase} theory (on the roof)",
                marker=dict(color=colour, symbol="circle-open", size=11),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=part.intensity,
                y=part.achieved_flops_per_s / 1e9,
                mode="markers+text",
                name=f"{phase} measured",
                text=[f"{lab}: {p:.0f}%" for lab, p in zip(part.label, part.pct_of_roof, strict=True)],
                textposition=[LABEL_POSITIONS[i % len(LABEL_POSITIONS)] for i in range(len(part))],
                marker=dict(color=colour, size=10),
            )
        )
    if guess is not None:
        first = df[df.phase == "decode"].sort_values("intensity").iloc[0]
        fig.add_trace(
            guess_marker(
                first.intensity, first.attainable_flops_per_s / 1e9 * guess / 100, f"your guess: {guess:g}%"
            )
        )
    mark_x(fig, roof.ridge, f"ridge {roof.ridge:.1f} FLOP/B", log_x=True)
    fig.update_xaxes(title="arithmetic intensity (FLOP / byte, analytic)", type="log")
    fig.update_yaxes(title="GFLOP/s", type="log")
    bw, fl = roof.bandwidth_bytes_per_s / 1e9, roof.flops_per_s / 1e9
    return finish(fig, f"Roofline of this machine ({bw:.1f} GB/s, {fl:.1f} GFLOP/s, measured now)")


# -- 4. KV cache ---------------------------------------------------------------------------------


def kv_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    lat, mem = go.Figure(), go.Figure()
    for mode, part in df.groupby("mode", sort=False):
        colour = MODE_COLOURS.get(mode, GREY)
        lat.add_trace(series(part.position, part.step_ms, f"cache={mode} (wall)", colour, mode="lines"))
        if result.device == "cpu":  # on a GPU the host's CPU time is not the step's work
            lat.add_trace(cpu_time_line(part.position, part.cpu_ms, f"cache={mode} (CPU time)", colour))
        mem.add_trace(
            go.Scatter(
                x=part.position, y=part.kv_mb, mode="lines", name=f"cache={mode}", line=dict(color=colour)
            )
        )
    for run in result.runs:
        if run.mode == "static" and run.kv_allocated_mb > 0:  # the counter is built full-size up front
            mem.add_trace(
                series(
                    [df.position.min(), df.position.max()],
                    [run.kv_allocated_mb] * 2,
                    "cache=static, allocated up front",
                    POT,
                    mode="lines",
                    dash="dash",
                )
            )
    if guess is not None and "none" in set(df["mode"]):
        none = df[df["mode"] == "none"]
        fifth = max(1, len(none) // 5)
        lat.add_trace(
            guess_marker(
                none.position.iloc[-1], none.step_ms.iloc[:fifth].median() * guess, f"your guess: {guess:g}x"
            )
        )
    lat.update_xaxes(title="sequence position (tokens so far)")
    lat.update_yaxes(title="decode step (ms)", rangemode="tozero")
    mem.update_xaxes(title="sequence position (tokens so far)")
    mem.update_yaxes(title="KV cache live (MB)", rangemode="tozero")
    return [
        finish(lat, "Keep the soup warm: per-step latency with and without the KV cache"),
        finish(mem, "The serving counter fills up: KV cache memory over the generation"),
    ]


# -- 5. portioning station -----------------------------------------------------------------------


def overhead_figure(result, guess: float | None = None) -> go.Figure:
    df = result.to_frame()
    fig = go.Figure()
    parts = (
        ("math_ms", "model math (op self time)", POT),
        ("glue_ms", "glue inside forward", "#f0a202"),
        ("outside_ms", "outside forward (sampling, bookkeeping)", GREY),
    )
    for col, name, colour in parts:
        fig.add_trace(
            go.Bar(
                x=df.variant,
                y=df[col],
                name=name,
                marker_color=colour,
                text=[f"{v:.2f} ms" for v in df[col]],
                textposition="inside",
            )
        )
    if guess is not None:
        fig.add_trace(
            guess_marker(df.variant.iloc[0], df.step_ms.iloc[0] * guess / 100, f"your guess: math {guess:g}%")
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="per decode step (ms)")
    return finish(fig, f"The portioning station: what one decode step is made of ({result.device})")


# -- 6. prep standard ----------------------------------------------------------------------------


def padding_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    slots = go.Figure()
    slots.add_trace(go.Bar(x=df["mode"], y=df.tokens, name="real tokens", marker_color=POT))
    slots.add_trace(
        go.Bar(
            x=df["mode"],
            y=df.wasted_slots,
            name="padding (idle wok)",
            marker_color=WOK,
            text=[f"{s:.0%} idle" for s in df.idle_share],
            textposition="outside",
        )
    )
    if guess is not None:
        pad = df[df["mode"] == "padded"].iloc[0]
        slots.add_trace(guess_marker("padded", pad.slots * guess / 100, f"your guess: {guess:g}% idle"))
    slots.update_layout(barmode="stack")
    slots.update_yaxes(title="token slots computed in prefill")
    time = go.Figure(
        go.Bar(
            x=df["mode"],
            y=df.prefill_s * 1e3,
            marker_color=[MODE_COLOURS[m] for m in df["mode"]],
            text=[f"{v * 1e3:.1f} ms" for v in df.prefill_s],
            textposition="outside",
        )
    )
    time.update_yaxes(title="prefill pass (ms, median)")
    return [
        finish(slots, "The prep standard: slots the wok heats, padded vs packed"),
        finish(time, "Prefill time for the same mixed batch"),
    ]


# -- 7. metrics defined --------------------------------------------------------------------------


def metrics_figures(result, guess: float | None = None) -> list[go.Figure]:
    stream = result.stream_frame()
    timeline = go.Figure(
        go.Bar(
            x=stream.token,
            y=stream.gap_ms,
            marker_color=[WOK] + [POT] * (len(stream) - 1),
            name="gap before token (ms)",
        )
    )
    timeline.update_xaxes(title="output token")
    timeline.update_yaxes(title="wait before this token (ms)", type="log")
    finish(timeline, "One recorded stream: the first wait is the wok (TTFT), the rest are ladles")

    defs = result.to_frame()
    ms = defs[defs.unit == "ms"]
    # Orange: the number includes the wok's time (TTFT); teal: the soup pot's alone.
    bars = go.Figure(
        go.Bar(
            x=ms.name,
            y=ms.value,
            marker_color=[WOK if p else POT for p in ms.includes_prefill],
            hovertext=ms.formula,
            text=[f"{v:.1f}" for v in ms.value],
            textposition="outside",
        )
    )
    if guess is not None:
        bars.add_trace(
            guess_marker("ITL incl. TTFT", result.value("TPOT") * guess, f"your guess: {guess:g}x TPOT")
        )
    bars.update_yaxes(title="ms", type="log")
    finish(bars, "Same stream, different stopwatches (orange: includes the wok's TTFT)")

    tps = defs[defs.unit == "tok/s"]
    rates = go.Figure(
        go.Bar(
            x=tps.name,
            y=tps.value,
            marker_color=[WOK if p else POT for p in tps.includes_prefill],
            hovertext=tps.formula,
            text=[f"{v:.1f}" for v in tps.value],
            textposition="outside",
        )
    )
    rates.update_yaxes(title="tokens / s")
    return [timeline, bars, finish(rates, "Same stream, different throughputs")]


# -- dashboard -----------------------------------------------------------------------------------


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
