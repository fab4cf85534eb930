"""Lab charts a class can read (issue 14): log axes labelled with whole values, not plotly's minor
digits; the legend under the x-axis title, not over it; roofline labels set apart."""

from __future__ import annotations

import plotly.graph_objects as go

from kitchen_viz.charts import LABEL_POSITIONS, finish, log_ticks, tick_text


def test_log_ticks_are_one_two_five_on_short_ranges_and_decades_on_long_ones():
    assert log_ticks(3, 700) == [5, 10, 20, 50, 100, 200, 500]
    assert log_ticks(0.1, 1e6) == [0.1, 1, 10, 100, 1e3, 1e4, 1e5, 1e6]
    assert log_ticks(8, 14) == [8, 9, 10]  # inside one step: every digit, still whole values
    assert [tick_text(v) for v in (1, 2000, 5e6, 0.02)] == ["1", "2k", "5M", "0.02"]


def test_finished_figures_label_log_axes_and_keep_the_legend_off_the_axis_title():
    fig = go.Figure(
        [go.Scatter(x=[8, 16, 32, 64], y=[3.1, 4.2, 9.9, 30.0], name="a"), go.Scatter(x=[8], y=[5], name="b")]
    )
    fig.update_xaxes(title="batch", type="log")
    fig.update_yaxes(title="µs", type="log")
    finish(fig, "t")
    assert list(fig.layout.xaxis.tickvals) == [10, 20, 50]  # inside 8..64; no "8 9 1 2 3" minor digits
    assert list(fig.layout.xaxis.ticktext) == ["10", "20", "50"]
    assert list(fig.layout.yaxis.tickvals) == [5, 10, 20]
    assert fig.layout.legend.yanchor == "top" and fig.layout.legend.y < 0  # below the plot ...
    assert fig.layout.margin.b >= 120  # ... with room under the x-axis title


def test_neighbouring_roofline_labels_alternate_sides():
    assert len(set(LABEL_POSITIONS)) == len(LABEL_POSITIONS) >= 2
