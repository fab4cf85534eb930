
"""The lab's plumbing: ETA arithmetic, the result cache, dashboard percentiles, charts and PNG export."""

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from proc_kit import run

from engine.bench.roofline import Roofline
from kitchen_viz.charts import SLOW_TAIL
from lab.banquet import BanquetPoint, saturation_point
from lab.cache import ResultCache, cache_key, latest_roof, model_fingerprint, remember_roof
from lab.export import RENDER_TRIES, PngExportError, figure_png, write_pngs
from lab.monitoring import requests_per_minute, summary, with_percentiles
from lab.noise import MachineWatch, clearly_apart, error_bars, spread_of
from lab.progress import ProgressTracker
from lab.roofline_lab import RooflineResult, RooflineSettings, place, roofline_figure


def test_eta_uses_the_measured_pace_over_work_units(monkeypatch):
    clock = iter([0.0, 0.6, 1.8])
    monkeypatch.setattr("lab.progress.time.perf_counter", lambda: next(clock))
    seen = []
    tracker = ProgressTracker([1, 2, 4, 8], seen.append)  # starts at t=0.0
    tracker.step("a")  # t=0.6 after 1 unit: 14 units left at 0.6 s/unit
    assert seen[-1].eta_s == pytest.approx(8.4) and seen[-1].fraction == pytest.approx(1 / 15)
    tracker.step("b")  # t=1.8 after 3 units: 12 left at 0.6 s/unit
    assert seen[-1].eta_s == pytest.approx(7.2) and seen[-1].done == 2
    assert "2/4: b (about 7 s left)" == seen[-1].line()


@dataclass(frozen=True)
class Knobs:
    lengths: tuple[int, ...] = (16, 32)
    repeats: int = 3


def test_cache_key_changes_with_every_input_and_is_stable():
    base = cache_key("banquet", "chef", "cpu", "float32", Knobs())
    assert base == cache_key("banquet", "chef", "cpu", "float32", Knobs())
    others = [
        cache_key("tables", "chef", "cpu", "float32", Knobs()),
        cache_key("banquet", "preset:smollm2-135m", "cpu", "float32", Knobs()),
        cache_key("banquet", "chef", "cuda:0", "float32", Knobs()),
        cache_key("banquet", "chef", "cpu", "bfloat16", Knobs()),
        cache_key("banquet", "chef", "cpu", "float32", Knobs(repeats=1)),
    ]
    assert base not in others and len(set(others)) == len(others)


def test_cache_round_trip_and_unreadable_files_are_misses(tmp_path):
    cache = ResultCache(tmp_path / "c")
    key = cache_key("banquet", "chef", "cpu", "float32", Knobs())
    assert cache.get(key) is None
    saved = cache.put(key, {"ttft_s": [0.1, 0.2]})
    got = cache.get(key)
    assert got.result == {"ttft_s": [0.1, 0.2]} and got.saved_at == saved.saved_at
    cache.path(key).write_bytes(b"not a pickle")
    assert cache.get(key) is None
    cache.drop(key)
    assert not cache.path(key).exists()


def runs_frame(n: int) -> pd.DataFrame:
    t = pd.date_range("2026-01-01", periods=n, freq="30s", tz="UTC")
    return pd.DataFrame(
        {
            "wall_time": t,
            "model": "chef",
            "ttft_s": np.arange(1, n + 1) / 100,
            "tpot_s": 0.01,
            "decode_tps": 100.0,
            "e2e_s": 0.5,
            "queue_wait_s": 0.0,
            "kv_cache_mb": 1.0,
        }
    )


def test_percentiles_cover_a_trailing_window():
    stats = with_percentiles(runs_frame(20), ["ttft_s"], window="5min")
    last = stats.iloc[-1]
    # 30 s apart: a 5-minute window ending at run 20 holds runs 11..20 (ttft 0.11..0.20).
    assert last.window_runs == 10
    assert last.ttft_s_p50 == pytest.approx(np.percentile(np.arange(11, 21) / 100, 50))
    assert last.ttft_s_p99 == pytest.approx(np.percentile(np.arange(11, 21) / 100, 99))
    assert stats.iloc[0].ttft_s_p50 == pytest.approx(0.01)


def test_requests_per_minute_and_empty_log():
    assert list(requests_per_minute(runs_frame(6))) == [2, 2, 2]
    empty = runs_frame(0)
    assert with_percentiles(empty, ["ttft_s"]).empty and requests_per_minute(empty).empty
    assert summary(empty) == {"runs": 0}


def fake_roofline_result() -> RooflineResult:
    """Constructed measurements (not engine output), to test the figure's drawing only."""
    roof = Roofline(bandwidth_bytes_per_s=20e9, flops_per_s=100e9, device="cpu", dtype="float32")
    points = [
        place("prefill", "prompt 256", 2.5e9, 23e6, 0.04, roof),
        place("decode", "batch 1", 1e7, 2e7, 0.005, roof),
    ]
    return RooflineResult(settings=RooflineSettings(), roof=roof, points=points, sample=None)


def test_roofline_figure_draws_roof_both_phases_and_the_guess():
    result = fake_roofline_result()
    fig = roofline_figure(result, guess=30)
    names = [(t.name or "").replace("<br>", " ") for t in fig.data]
    assert names[0] == "DRAM roof (20 GB/s, measured)"  # no cache roof measured: DRAM's alone
    # Each phase's points, their share of the roof named in the legend (labels on the points collided).
    assert any(n.startswith("prefill measured") and "prompt 256" in n and "%" in n for n in names), names
    assert any(n.startswith("decode measured") and "batch 1" in n for n in names), names
    star = next(t for t, n in zip(fig.data, names, strict=True) if n.startswith("your guess"))
    decode = result.points[1]
    assert star.y[0] == pytest.approx(decode.attainable_flops_per_s / 1e9 * 0.30)
    assert not any((t.name or "").startswith("your guess") for t in roofline_figure(result, guess=None).data)


def test_roofline_figure_draws_every_cache_roof_and_marks_a_point_above_them_all():
    from engine.bench.roofline import MemoryRoof

    roof = Roofline(20e9, 100e9, "cpu", "float32",
                    caches=(MemoryRoof("L2", 100e9, 2**20), MemoryRoof("L3", 70e9, 32 * 2**20)))  # fmt: skip
    points = [place("decode", "batch 1", 1e7, 2e7, 0.0005, roof),  # 20 GFLOP/s at 0.5: under L3's 35
              place("decode", "batch 4", 4e7, 2e7, 0.0003, roof)]  # 133 GFLOP/s: above every roof  # fmt: skip
    assert [(p.roof, p.above_every_roof) for p in points] == [("L3", False), ("L3", True)]
    fig = roofline_figure(RooflineResult(settings=RooflineSettings(), roof=roof, points=points, sample=None))
    names = [(t.name or "").replace("<br>", " ") for t in fig.data]
    assert names[:3] == ["DRAM roof (20 GB/s, measured)", "L3 roof (32 MB, 70 GB/s, measured)",
                         "L2 roof (1 MB, 100 GB/s, measured)"]  # fmt: skip
    measured = next(t for t, n in zip(fig.data, names, strict=True) if n.startswith("decode measured"))
    assert list(measured.marker.symbol) == ["circle", "x"]  # the artefact is drawn as measured, and marked
    assert "batch 1 57% of L3" in measured.name.replace("<br>", " ")


@pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"), reason="no Chromium"
)
def test_png_export_writes_real_png_files(tmp_path):
    figs = [roofline_figure(fake_roofline_result(), guess=None)]
    (path,) = write_pngs(figs, [tmp_path / "roof.png"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert figure_png(figs[0])[:8] == b"\x89PNG\r\n\x1a\n"  # what the page's download button serves
    # A chart kaleido returns an error for (here: not a figure) is named, with kaleido's error, and the
    # others are written: kaleido returns such errors rather than raising them.
    with pytest.raises(PngExportError) as err:
        write_pngs([figs[0], {"not": "a figure"}], [tmp_path / "good.png", tmp_path / "bad.png"])
    assert str(err.value).startswith(f"Chromium drew no PNG for bad.png after {RENDER_TRIES} tries"), err.value
    assert "TypeError: Figure supplied doesn't seem to be a valid plotly figure" in str(err.value)
    assert (tmp_path / "good.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "bad.png").exists()


def test_a_png_export_that_fails_says_which_charts_and_why(tmp_path, monkeypatch):
    """No file and no message was the old failure (plotly dropped kaleido's returned errors)."""
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium-here"))
    figs = [roofline_figure(fake_roofline_result(), guess=None)]
    with pytest.raises(PngExportError) as err:
        write_pngs(figs, [tmp_path / "roof.png"])
    said = str(err.value)
    assert said.startswith(f"Chromium drew no PNG for roof.png after {RENDER_TRIES} tries")
    assert "ChromeNotFoundError" in said and "no-chromium-here" in said and not (tmp_path / "roof.png").exists()
    with pytest.raises(PngExportError, match=f"no PNG of the chart after {RENDER_TRIES} tries"):
        figure_png(figs[0])


def test_latest_roof_is_kept_per_device_and_dtype(tmp_path):
    cache = ResultCache(tmp_path)
    roof = Roofline(bandwidth_bytes_per_s=20e9, flops_per_s=100e9, device="cpu", dtype="float32")
    assert latest_roof("cpu", "float32", cache) is None
    remember_roof(roof, cache)
    assert latest_roof("cpu", "float32", cache) == roof
    assert latest_roof("cpu", "bfloat16", cache) is None


def test_percentile_lines_are_the_slow_tail_for_times_and_for_rates():
    """The dashboard's p99 tokens/s line was the fastest one: for a rate the slow tail is the low end."""
    frame = pd.DataFrame({"wall_time": pd.date_range("2026-01-01", periods=100, freq="s"),
                          "ttft_s": np.linspace(0.01, 1.0, 100), "decode_tps": np.linspace(10, 1000, 100)})
    last = with_percentiles(frame, ["ttft_s", "decode_tps"], window="10min", rates=("decode_tps",)).iloc[-1]
    assert last.ttft_s_p99 > last.ttft_s_p50 > 0.4  # a time: the slow tail is high
    assert last.decode_tps_p1 < last.decode_tps_p10 < last.decode_tps_p50  # a rate: the slow tail is low
    assert last.decode_tps_p1 == pytest.approx(np.quantile(frame.decode_tps, 0.01))
    assert [name for _, name, _ in SLOW_TAIL["rate"]][1:] == ["p10 (slowest 10 %)", "p1 (slowest 1 %)"]


def test_spreads_keep_the_median_and_range_and_only_ranges_apart_count_as_a_difference():
    s = spread_of([0.070, 0.048, 0.071])
    assert (s.median, s.low, s.high, s.n) == (0.070, 0.048, 0.071, 3)
    assert s.scaled(1e3).median == pytest.approx(70.0)
    rate = s.inverse(256)  # a time's range as a rate's: the slow end is the low rate
    assert rate.low == pytest.approx(256 / 0.071) and rate.high == pytest.approx(256 / 0.048)
    assert not clearly_apart(spread_of([1, 2, 3]), spread_of([2.5, 4, 5]))
    assert clearly_apart(spread_of([1, 2, 3]), spread_of([3.5, 4, 5]))
    bars = error_bars([spread_of([1, 2, 4])])
    assert (bars["array"], bars["arrayminus"], bars["symmetric"]) == ([2.0], [1.0], False)


def test_a_busy_machine_is_measured_by_the_kitchens_meter_and_named_in_the_result():
    """Another program on the engine's cores during a measurement: the watch says so, with the load."""
    watch = MachineWatch()
    burn = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass\n"
    run([sys.executable, "-c", burn], timeout=60)
    machine = watch.finish()
    assert machine.busy and "something else used the engine's cores for" in machine.line, machine
    assert "core-seconds of this measurement's" in machine.line and machine.load >= 0
    assert machine.summary().startswith("While this was measured, something else used")
    assert machine.too_noisy("where the wok is full").startswith(
        f"too noisy to say where the wok is full; the machine was busy (load {machine.load:.1f})")


def banquet_point(tokens: int, rates: list[float]) -> BanquetPoint:
    rate = spread_of(rates)
    return BanquetPoint(tokens, 0.0, 0.0, rate.median, 0.0, 0.0, 0.0, 0.0, spread_of([0.0]), rate)


def test_the_wok_is_called_full_only_where_the_rise_to_it_beats_the_repeats_spread():
    steady = [banquet_point(16, [2.0, 2.1, 1.9]), banquet_point(64, [5.0, 5.2, 4.8]), banquet_point(256, [5.1, 5.3, 4.9])]
    assert saturation_point(steady) == 64
    # The busy machine: 2137 -> 3663 -> ... with repeats spread wider than the rise.
    noisy = [banquet_point(16, [2.0, 6.0, 4.0]), banquet_point(64, [5.0, 2.0, 6.5]), banquet_point(256, [5.0, 3.0, 6.0])]
    assert saturation_point(noisy) is None
    flat = [banquet_point(16, [5.0, 5.1, 4.9]), banquet_point(64, [5.0, 5.2, 4.9])]
    assert saturation_point(flat) == 16
    assert saturation_point([banquet_point(16, [5.0, 9.0, 2.0]), banquet_point(64, [5.0, 5.1, 4.9])]) is None


def test_model_fingerprint_changes_when_the_weights_change(tmp_path):
    folder = tmp_path / "chef"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"x" * 10)
    before = model_fingerprint(str(folder))
    assert before == model_fingerprint(str(folder)) and before.startswith(str(folder))
    weights.write_bytes(b"y" * 11)  # retrained: new size (and time)
    assert model_fingerprint(str(folder)) != before
    assert model_fingerprint("preset:smollm2-135m") == "preset:smollm2-135m"
    assert model_fingerprint("chef").startswith("chef@")  # the catalog's chef folder
