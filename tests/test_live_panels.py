"""The live view's cheap parts: the in-place panels' data and the bench's reading of perf samples."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kitchen_viz.live_panels import live_panel_data, spark_points
from kitchen_viz.panels import PanelValues

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "ui_overhead_bench.py"


def test_live_panels_get_the_panels_numbers_preformatted_and_every_itl():
    values = PanelValues(ttft_s=0.0123, tpot_s=0.0033, decode_tps=303.0, itl_s=[0.0031, 0.0035])
    data = live_panel_data(values, queue_wait_s=0.25)
    assert data["ttft"] == "12.30 ms" and data["tpot"] == "3.30 ms" and data["e2e"] == "—"
    assert data["tps"] == "303 tok/s" and data["latest_itl"] == "3.50 ms" and data["steps"] == 2
    assert data["itl_ms"] == [3.1, 3.5] and data["wait"] == "waited 250.0 ms in line first"
    empty = live_panel_data(PanelValues())
    assert empty["itl_ms"] == [] and empty["latest_itl"] == "—" and empty["wait"] == ""


def test_a_long_itl_series_is_cut_to_its_buckets_slowest_step():
    assert spark_points([1, 5, 2, 2], limit=2) == [5.0, 2.0]
    series = [3.0] * 1000
    series[517] = 40.0  # one stall
    cut = spark_points(series, limit=240)
    assert len(cut) <= 240 and max(cut) == 40.0


def load_bench():
    spec = importlib.util.spec_from_file_location("ui_overhead_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_finds_the_cook_in_perf_samples_and_who_else_ran():
    bench = load_bench()
    lines = ["python 10 1.000:", "chromium 20 1.001:"]  # before the cook: the page, a quick question
    lines += [f"python 11 {2 + i * 0.0005:.4f}:" for i in range(90)]  # the engine cooks 45 ms
    lines += [f"ThreadPoolForeg 20 {2.0452 + i * 0.0005:.4f}:" for i in range(10)]
    lines += [f"python 11 {2.0502 + i * 0.0005:.4f}:" for i in range(10)]
    shares = bench.cook_span_shares("\n".join(lines))
    assert shares["engine_share"] == 0.909 and shares["others"] == {"ThreadPoolForeg": 0.091}
    assert 0.05 < shares["span_s"] < 0.06


def test_the_bench_alternates_which_side_cooks_first_abba():
    bench = load_bench()
    assert [bench.quiet_first(r) for r in range(4)] == [True, False, True, False]
