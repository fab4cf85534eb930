"""The live view's cheap parts: the in-place panels' data and the bench's reading of perf samples."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.bench import cook_probe
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
    idle, engine, raster = ("swapper/1", 0), ("python", 11), ("ThreadPoolForeg", 20)
    lines = [
        switch(1, 1.0000, idle, engine), switch(1, 1.0001, engine, idle),  # a 0.1 ms wake-up
        switch(1, 2.0000, idle, engine),
        switch(1, 2.0200, engine, raster), switch(1, 2.0250, raster, engine),
        switch(1, 2.0500, engine, idle), switch(1, 3.0000, idle, idle),
    ]  # fmt: skip
    held = cook_probe.cook_span_holders("\n".join(lines))
    assert held["span_s"] == 0.05 and held["engine_share"] == 0.9
    assert held["others_ms"] == 5.0 and held["others_runs"] == 1 and held["others"] == {"ThreadPoolForeg": 5.0}


def test_the_bench_alternates_which_side_cooks_first_abba():
    bench = load_bench()
    assert [bench.quiet_first(r) for r in range(4)] == [True, False, True, False]


def test_paired_overheads_give_the_median_and_an_interval_around_it():
    """Each round's B/A - 1 is one sample: B is 1-4 % slower than A in these rounds, whatever A's level."""
    from engine.bench.report import paired

    p = paired([1.0, 2.0, 3.0, 4.0, 5.0], [1.01, 2.04, 3.06, 4.12, 5.2])
    assert p["paired_overheads"] == pytest.approx([0.01, 0.02, 0.02, 0.03, 0.04])
    assert p["paired_median"] == pytest.approx(0.02)
    lo, hi = p["paired_ci95"]
    assert 0.01 <= lo <= 0.02 <= hi <= 0.04 + 1e-12
    assert paired([1.0] * 3, [1.0] * 3)["paired_ci95"] == [0.0, 0.0]  # no difference, no interval


def test_the_bench_counts_the_browsers_cpu(tmp_path):
    """A process the kernel names "chromium-busy" (a Python spinning for 0.6 s of CPU) is counted (psutil)."""
    fake = tmp_path / "chromium-busy"
    fake.symlink_to(sys.executable)  # the kernel names a process after the file it executed
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    child = subprocess.Popen([str(fake), "-c", spin])
    try:
        deadline = time.monotonic() + 20
        while cook_probe.cpu_s([child.pid]) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cook_probe.cpu_s([child.pid]) >= 0.5 and child.pid in cook_probe.browser_pids()
        # the sum over every browser includes it (other tests' browsers may come and go meanwhile,
        # so the sum is compared with the child's own share, not with an earlier sum)
        assert cook_probe.cpu_s(cook_probe.browser_pids()) >= cook_probe.cpu_s([child.pid])
    finally:
        child.kill()
        child.wait()


def test_the_browser_meter_reads_cpu_seconds_per_second_between_two_instants():
    """Samples every 0.1 s of a browser using half a core: between 0.25 s and 0.75 s it used 0.25 s."""
    meter = cook_probe.BrowserMeter()
    meter.samples = [(t / 10, t / 20) for t in range(11)]  # (time, CPU seconds so far)
    assert meter.cores_busy(0.25, 0.75) == 0.5
    assert meter.cores_busy(0.5, 2.0) is None  # a span the samples do not cover is not guessed


def test_pool_joins_the_rounds_of_series_of_the_same_code_and_kind():
    bench = load_bench()
    one = {"code": "v2", "live_view": True, "tpot_no_ui_s": [1.0, 1.0], "tpot_live_s": [1.01, 1.03]}
    two = {"code": "v2", "live_view": True, "tpot_no_ui_s": [2.0], "tpot_live_s": [2.04]}
    aa = {"code": "v2", "live_view": False, "tpot_no_ui_s": [1.0], "tpot_live_s": [1.0]}
    old = {"live_view": True, "tpot_no_ui_s": [1.0], "tpot_live_s": [2.0]}  # no code: never pooled
    rows = {r["live_view"]: r for r in bench.pool([one, two, aa, old])}
    assert rows[True]["series"] == 2 and rows[True]["rounds"] == 3
    assert rows[True]["paired_median"] == pytest.approx(0.02)
    assert rows[False]["rounds"] == 1 and rows[False]["paired_median"] == 0.0


def test_pool_refuses_a_file_that_is_not_a_results_file_in_one_line(tmp_path, capsys):
    bench = load_bench()
    (tmp_path / "notes.json").write_text('{"rounds": 3}')
    for path in (tmp_path / "missing.json", tmp_path / "notes.json"):
        assert bench.main(["--pool", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--pool {path}: not a results file with a 'series' list" in err
