"""The two panels while an order cooks in the live view: the same numbers, drawn in place.

Why not the Streamlit metrics the panels use at rest: the live view refreshes twice a second while
the engine is being measured, and on a small machine the browser's work shares cores with the
engine. Re-rendering the Streamlit panels every tick (columns, metrics, a chart area that changes
size) made Chromium re-lay-out and re-rasterize the page below them: perf sampling the engine's
core during a live Cook showed 10-15 % of it taken by Chromium's raster threads in bursts at each
tick, and none of those bursts with the panels left out (docs/benchmarks/ui-overhead.md). While
cooking, the scene component (kitchen_viz/scene.py, kitchen_viz/art/scene.js) draws these panels in a
fixed-height box above the kitchen, from `scene_data()["panels"]`: one element updated per tick
instead of two, changing the text of a few nodes and one SVG polyline (the ITL of every step so
far). When the order is done the page draws the ordinary panels (kitchen_viz.panels) with the
engine's own metrics and the ITL bar chart.
"""

from __future__ import annotations

from kitchen_viz.panels import PanelValues
from lab.units import fmt_s, fmt_tps

SPARK_POINTS = 240  # at most this many ITL points are sent; longer runs keep each bucket's slowest


def live_panel_data(values: PanelValues, queue_wait_s: float | None = None) -> dict:
    """The preformatted numbers and the ITL series (ms) the component draws.

    Example: ttft 0.0123 s, itl [0.0031, 0.0035] -> {"ttft": "12.30 ms", ..., "itl_ms": [3.1, 3.5]}.
    """
    return {
        "ttft": fmt_s(values.ttft_s),
        "ttft_label": values.ttft_label,
        "wok": values.wok,
        "e2e": fmt_s(values.e2e_s),
        "tpot": fmt_s(values.tpot_s),
        "tps": fmt_tps(values.decode_tps),
        "latest_itl": fmt_s(values.itl_s[-1]) if values.itl_s else "—",
        "steps": len(values.itl_s),
        "itl_ms": spark_points([x * 1e3 for x in values.itl_s]),
        "wait": f"waited {fmt_s(queue_wait_s)} in line first" if queue_wait_s else "",
    }


def spark_points(ms: list[float], limit: int = SPARK_POINTS) -> list[float]:
    """`ms` rounded to 0.01, cut to at most `limit` points by keeping the slowest of each bucket
    (a stall stays visible). Example: [1, 5, 2, 2] with limit 2 -> [5.0, 2.0]."""
    if len(ms) > limit:
        size = -(-len(ms) // limit)
        ms = [max(ms[i : i + size]) for i in range(0, len(ms), size)]
    return [round(x, 2) for x in ms]
