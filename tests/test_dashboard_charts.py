"""The Dashboard's charts: percentile lines are the slow tail of each metric, said in the legend, and
every chart's text is at least 16 px in bands that keep title, legend and axes apart."""

from __future__ import annotations

import pandas as pd

from kitchen_viz.charts import CHART_FONT_PX, PRESENTER_CHART_FONT_PX, legend_rows, percentile_figure
from lab.monitoring import with_percentiles


def frame_of(values: list[float]) -> pd.DataFrame:
    times = pd.date_range("2026-01-01 12:00", periods=len(values), freq="10s", tz="UTC")
    return pd.DataFrame({"wall_time": times, "decode_tps": values, "ttft_s": [v / 1000 for v in values]})


def test_the_tokens_per_second_tail_is_the_slow_end_and_the_legend_says_so():
    stats = with_percentiles(frame_of([100.0] * 9 + [10.0]), ["decode_tps", "ttft_s"], "5min", rates=("decode_tps",))
    fig = percentile_figure(stats, "decode_tps", "Decode tokens/s", 1.0, "tokens / s", rate=True)
    lines = {t.name: list(t.y) for t in fig.data if t.mode == "lines"}
    assert set(lines) == {"p50 (median)", "p10 (slowest 10 %)", "p1 (slowest 1 %)"}
    assert lines["p1 (slowest 1 %)"][-1] < lines["p10 (slowest 10 %)"][-1] < lines["p50 (median)"][-1] == 100.0
    ttft = percentile_figure(stats, "ttft_s", "TTFT", 1e3, "ms")
    assert {t.name for t in ttft.data if t.mode == "lines"} == {"p50 (median)", "p90 (slowest 10 %)", "p99 (slowest 1 %)"}


def test_every_text_of_a_chart_is_at_least_16_px_and_presenter_mode_is_larger():
    stats = with_percentiles(frame_of([100.0, 90.0, 80.0]), ["decode_tps"], "5min", rates=("decode_tps",))
    for presenter, size in ((False, CHART_FONT_PX), (True, PRESENTER_CHART_FONT_PX)):
        fig = percentile_figure(stats, "decode_tps", "Decode tokens/s", rate=True, presenter=presenter)
        lay = fig.layout
        sizes = [lay.font.size, lay.title.font.size, lay.legend.font.size, lay.xaxis.tickfont.size,
                 lay.yaxis.tickfont.size, lay.xaxis.title.font.size, lay.yaxis.title.font.size]  # fmt: skip
        assert min(sizes) == size >= 16
        assert lay.xaxis.tickformat == "%H:%M:%S" and lay.xaxis.title.text == "time (UTC) on 1 Jan 2026"  # 30 s of runs
        assert lay.legend.y > 1 and lay.legend.yanchor == "bottom"  # above the plot, under the title
        assert lay.margin.t >= 10 + 1.5 * (size + 2) + legend_rows(fig, size) * (1.5 * size + 8)
