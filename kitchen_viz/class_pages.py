"""What the class kitchen's pages say about where the class kitchen is, and the pass's orders chart.

The app is launched one of three ways, and each page tells the instructor what is true for it:

  `two-pot-kitchen` (the class kitchen on by default)  the app itself serves the class kitchen at
        /class on its own port: nothing else to start; students point an OpenAI client there
  `two-pot-kitchen --backend URL`  the pages read the kitchen server at URL
  `streamlit run app.py` (no class kitchen)  start one with `two-pot-kitchen serve`

`orders_figure` draws the orders running and waiting over the pass's readings with whole-number
ticks from 0: an idle kitchen reads "0", never "0.000000".
"""

from __future__ import annotations

import plotly.graph_objects as go

from kitchen_viz.charts import GREY, POT, legible
from serving.app_settings import AppSettings


def where_the_class_kitchen_is(address: str) -> str:
    """One sentence: where the class kitchen these pages read comes from, for how the app was launched."""
    s = AppSettings.current()
    if s.backend:
        return (f"This app was started with `--backend`: the pages read the kitchen server at {s.backend}, and "
                "students order from it with any OpenAI client.")  # fmt: skip
    if s.class_model:
        return (f"This app serves the class kitchen itself ({s.class_model}, at {address}): nothing else to start; "
                "students point any OpenAI client at that address.")  # fmt: skip
    return ("Start the class kitchen with `two-pot-kitchen serve` (the README's classroom section); students "
            "order from it with any OpenAI client.")  # fmt: skip


def not_reachable(address: str) -> str:
    """What to check when the kitchen at `address` does not answer, for how the app was launched."""
    s = AppSettings.current()
    if s.class_model and not s.backend:
        return "The app's own class kitchen is still loading, or the address was changed: check it."
    return "Is `two-pot-kitchen serve` running at that address?"


def orders_figure(seconds: list[float], running: list[int], waiting: list[int], presenter: bool = False) -> go.Figure:
    """Orders running and waiting at each reading (x: seconds, 0 = now). Whole-number ticks from 0 up
    to at least 1, so an idle kitchen's axis reads 0 and 1, not "0.000000"."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=seconds, y=running, mode="lines", name="orders running", line=dict(color=POT, shape="hv")))
    fig.add_trace(go.Scatter(x=seconds, y=waiting, mode="lines", name="orders waiting", line=dict(color=GREY, shape="hv")))
    top = max([1, *running, *waiting])
    fig.update_layout(height=300 if presenter else 260, title="Orders in the kitchen",
                      xaxis_title="seconds (0 = now)", yaxis_title="orders")  # fmt: skip
    fig.update_yaxes(range=[0, top * 1.1], tickformat="d", dtick=1 if top <= 8 else None, rangemode="tozero")
    return legible(fig, presenter)
