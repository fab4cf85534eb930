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


def switch(cpu: int, t: float, prev: tuple[str, int], nxt: tuple[str, int]) -> str:
    """One line of `perf script -F cpu,time,trace` for a sched:sched_switch event."""
    return (f"[{cpu:03d}] {t:.6f}: prev_comm={prev[0]} prev_pid={prev[1]} prev_prio=120 prev_state=R ==> "
            f"next_comm={nxt[0]} next_pid={nxt[1]} next_prio=120")  # fmt: skip


def test_the_bench_finds_the_cook_in_context_switches_and_who_else_ran():
    """The engine (the Python task holding the core longest) cooks from 2.000 to 2.050 s, with
    Chromium's raster thread taking the core for 5 ms in the middle; its quick wake-up at 1.0 s (a
    question before the cook) is not part of the cook."""
    bench = load_bench()
    idle, engine, raster = ("swapper/1", 0), ("python", 11), ("ThreadPoolForeg", 20)
    lines = [
        switch(1, 1.0000, idle, engine), switch(1, 1.0001, engine, idle),  # a 0.1 ms wake-up
        switch(1, 2.0000, idle, engine),
        switch(1, 2.0200, engine, raster), switch(1, 2.0250, raster, engine),
        switch(1, 2.0500, engine, idle), switch(1, 3.0000, idle, idle),
    ]  # fmt: skip
    held = bench.cook_span_holders("\n".join(lines))
    assert held["span_s"] == 0.05 and held["engine_share"] == 0.9
    assert held["others_ms"] == 5.0 and held["others_runs"] == 1 and held["others"] == {"ThreadPoolForeg": 5.0}


def test_the_bench_alternates_which_side_cooks_first_abba():
    bench = load_bench()
    assert [bench.quiet_first(r) for r in range(4)] == [True, False, True, False]
