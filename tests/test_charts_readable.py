"""Lab charts a class can read: log axes labelled with whole values, not plotly's minor digits; the
legend under the x-axis title, not over it; text sized for the back row in presenter mode; roofline
labels set apart. (The browser tests measure the drawn text: tests/test_lab_charts_browser.py.)"""

from __future__ import annotations

import plotly.graph_objects as go

from kitchen_viz.charts import LABEL_POSITIONS, finish, log_ticks, tick_text
from lab.plot_kit import LABEL_ROOM, PRESENTER_TEXT_PX, labels_below_too, readable, wrap


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
    legend = fig.layout.legend  # at the foot of the chart, one entry per row ...
    assert (legend.yref, legend.y, legend.yanchor, legend.entrywidthmode) == ("container", 0, "bottom", "fraction")
    assert fig.layout.margin.b >= 2 * 13 * 1.4 + 2 * (13 * 1.4 + 4)  # ... under the tick labels and axis title


def test_neighbouring_roofline_labels_alternate_sides():
    assert len(set(LABEL_POSITIONS)) == len(LABEL_POSITIONS) >= 2


def test_presenter_mode_sizes_every_chart_text_for_the_back_row_and_makes_room_for_it():
    fig = go.Figure([go.Scatter(x=[1, 2], y=[3, 4], name=f"a curve with a long name number {i}", text=["x", "y"],
                                mode="lines+text") for i in range(3)])
    fig.add_annotation(x=1, y=1, yref="paper", yanchor="bottom", text="the wok is full", showarrow=False)
    finish(fig, "A title long enough to need two lines on a narrow chart in presenter mode, surely")
    plain_height, plain_top = fig.layout.height, fig.layout.margin.t
    readable(fig, presenter=True)
    px = PRESENTER_TEXT_PX
    assert px >= 16 and fig.layout.font.size == px and fig.layout.legend.font.size == px
    assert fig.layout.title.font.size > px and fig.layout.title.text.count("<br>") >= 1
    assert fig.layout.xaxis.tickfont.size == fig.layout.yaxis.title.font.size == px
    assert all(a.font.size == px for a in fig.layout.annotations)
    assert all(t.textfont.size == px for t in fig.data)
    assert fig.layout.margin.t > plain_top and fig.layout.height > plain_height  # the rows grew with the text
    assert readable(fig, presenter=True).layout.height == fig.layout.height  # applying it twice changes nothing


def test_wrap_breaks_at_spaces_and_keeps_a_long_word_whole():
    assert wrap("the wok is full from here", 10) == ["the wok is", "full from", "here"]
    assert wrap("a<br>b", 10) == ["a b"]
    assert wrap("supercalifragilistic x", 5) == ["supercalifragilistic", "x"]


def test_labels_below_too_leaves_a_label_row_under_zero_with_no_tick_in_it():
    for high, step in ((3.9, 1), (1.3, 0.25), (0.9, 0.2), (13, 2.5), (6.0, 1)):
        fig = go.Figure()
        labels_below_too(fig, high)
        low, top = fig.layout.yaxis.range
        assert top == high and low == -LABEL_ROOM * high
        assert fig.layout.yaxis.tick0 == 0 and fig.layout.yaxis.dtick == step
        assert step > -low and high / step <= 6  # no tick under zero, at most 6 steps above it
