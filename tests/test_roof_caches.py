"""The caches' roofs: sized from what the machine reports, read by the C probe, ordered as physics says.

No speed is asserted: machines are shared and noisy. What is asserted does not depend on the
machine's speed: the buffers' sizes follow the reported caches, the probe really reads every byte
(its sum is checked), bad arguments are refused at the C boundary, and the measured levels are
ordered L2 >= L3 >= DRAM within stated noise margins (a cache level is several times DRAM here),
in one of three measurements (a busy neighbour can break it in one).
"""

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.bench.cache_probe import BLOCK_WORDS, cache_levels, probe_library, read_rate
from engine.bench.roofline import MemoryRoof, Roofline, best_roof, measure_roofline

SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
needs_sizes = pytest.mark.skipif(not cache_levels(), reason="this machine reports no cache sizes")
# Shared cores slow any one measurement; these margins are what the order must survive.
L2_OVER_L3_AT_LEAST = 0.7  # on Zen 4 a core reads L2 about 1.5x as fast as L3; noise may eat that
L3_OVER_DRAM_AT_LEAST = 1.2  # L3 is about twice DRAM here (both read by the C probe); a buffer past L3 reads about 1x


MEASURE = dict(quick=False, buffer_bytes=256 * 2**20, gemm_sizes=(128,))  # 256 MiB: eight times a 32 MB L3
ATTEMPTS = 3  # a busy neighbour slows the cache reads (CPU time) more than DRAM's (memory time): measure again


@pytest.fixture(scope="module")
def roof() -> Roofline:
    # The DRAM roof's buffer is far past L3, so it is DRAM's; full repeats for a steadier figure.
    return measure_roofline("cpu", "float32", **MEASURE)


@pytest.mark.skipif(not SYSFS.is_dir(), reason="no Linux sysfs cache description here")
def test_cache_sizes_are_the_ones_linux_reports():
    reported = {}
    for index in SYSFS.glob("index*"):
        level = int((index / "level").read_text())
        if level >= 2:
            text = (index / "size").read_text().strip()
            reported[level] = int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]]
    levels = cache_levels()
    assert {c.level: c.size_bytes for c in levels} == reported
    assert all(c.source == "sysfs" for c in levels)
    assert [c.level for c in levels] == sorted(reported)


@needs_sizes
def test_each_cache_buffer_is_half_the_level_these_threads_can_hold(roof):
    threads = torch.get_num_threads()
    sizes = {c.level: (c.size_bytes if c.shared else c.size_bytes * threads) for c in cache_levels()}
    measured = roof.details["caches"]
    assert measured, roof.cache_notes
    levels = {c.level: c for c in cache_levels()}
    for m in measured:
        assert m["capacity_bytes"] == sizes[m["level"]]
        level, t = levels[m["level"]], m["threads"]  # the faster of one thread and all of them
        held = level.size_bytes if level.shared else level.size_bytes * t  # what the reading threads hold
        assert m["buffer_bytes"] <= held // 2  # whole blocks per thread: at most half
        assert m["buffer_bytes"] > held // 2 - BLOCK_WORDS * 8 * t
        assert m["bytes_per_call"] >= 256 * 2**20 and len(m["times_s"]) == roof.details["repeats"]
        assert m["bandwidth_bytes_per_s"] == pytest.approx(m["bytes_per_call"] / min(m["times_s"]))
        assert set(m["by_threads"]) == {"1", str(threads)} and m["bandwidth_bytes_per_s"] == max(m["by_threads"].values())
    assert [m.name for m in roof.caches] == [f"L{m['level']}" for m in measured]


def disorder(roof: Roofline) -> str | None:
    """What breaks the order L2 >= L3 >= DRAM beyond the margins in one measurement, or None."""
    by_name = {m.name: m.bandwidth_bytes_per_s for m in roof.caches}
    if "L3" not in by_name:
        return f"no L3 roof: {roof.cache_notes}"
    if by_name["L3"] < L3_OVER_DRAM_AT_LEAST * roof.bandwidth_bytes_per_s:
        return f"L3 {by_name['L3'] / 1e9:.1f} GB/s < {L3_OVER_DRAM_AT_LEAST} x DRAM {roof.bandwidth_bytes_per_s / 1e9:.1f} GB/s"
    if "L2" in by_name and by_name["L2"] < L2_OVER_L3_AT_LEAST * by_name["L3"]:  # L2 is measured wherever it holds anything
        return f"L2 {by_name['L2'] / 1e9:.1f} GB/s < {L2_OVER_L3_AT_LEAST} x L3 {by_name['L3'] / 1e9:.1f} GB/s"
    return None


@needs_sizes
def test_cache_roofs_are_ordered_L2_L3_DRAM_within_noise_margins(roof):
    """In one of up to ATTEMPTS measurements: a probe that read the wrong level (a buffer past its
    cache) would break the order in every one; a neighbour breaks it only while it is busy."""
    problems = [disorder(roof)]
    while problems[-1] is not None and len(problems) < ATTEMPTS:
        roof = measure_roofline("cpu", "float32", **MEASURE)
        problems.append(disorder(roof))
    assert problems[-1] is None, problems
    assert [m.name for m in roof.memory_roofs()][-1] == "DRAM"


def test_the_probe_reads_every_byte_and_refuses_bad_arguments():
    lib = probe_library()
    assert not isinstance(lib, str), lib
    rate, times, per_call = read_rate(2**20, 1, 3)
    assert rate > 0 and len(times) == 3 and per_call >= 256 * 2**20  # read_rate checks the sum itself
    words = np.ones(64, dtype=np.uint64)
    out = ctypes.c_uint64(0)
    assert lib.tpk_read_passes(words.ctypes.data, words.size, 2, 3, ctypes.byref(out)) == 0
    assert out.value == 3 * 64  # two slices of 32 words, three passes
    for threads, n, passes in ((0, 64, 1), (257, 64, 1), (4, 64, 1), (1, 64, 0)):  # 4 threads: 16 words each
        assert lib.tpk_read_passes(words.ctypes.data, n, threads, passes, ctypes.byref(out)) == -1
    assert lib.tpk_read_passes(None, 64, 1, 1, ctypes.byref(out)) == -1


def test_without_cache_sizes_only_dram_is_drawn_and_the_page_is_told(monkeypatch):
    import engine.bench.cache_probe as probe

    monkeypatch.setattr(probe, "cache_levels", lambda: [])
    reads, notes = probe.measure_cache_reads(1, 3)
    assert reads == [] and len(notes) == 1 and "only the DRAM roof is drawn" in notes[0]


def test_a_level_no_buffer_can_isolate_is_named_not_measured(monkeypatch):
    import engine.bench.cache_probe as probe

    # An L3 no bigger than the L2s of 8 threads: half of it cannot exceed what they hold.
    monkeypatch.setattr(probe, "cache_levels", lambda: [probe.CacheLevel(2, 2**20, False, "sysfs"),
                                                         probe.CacheLevel(3, 8 * 2**20, True, "sysfs")])  # fmt: skip
    reads, notes = probe.measure_cache_reads(8, 1)
    assert [r.name for r in reads] == ["L2"] and notes and notes[0].startswith("L3 not measured")


def test_home_is_the_smallest_level_the_bytes_fit_in():
    roof = Roofline(20e9, 100e9, "cpu", "float32",
                    caches=(MemoryRoof("L3", 70e9, 32 * 2**20), MemoryRoof("L2", 100e9, 2 * 2**20)))  # fmt: skip
    assert [m.name for m in roof.memory_roofs()] == ["L2", "L3", "DRAM"]
    assert roof.home(1e6).name == "L2"
    assert roof.home(19.8e6).name == "L3"  # the chef
    assert roof.home(538e6).name == "DRAM"  # the assistant
    assert roof.ridge_of(roof.home(19.8e6)) == pytest.approx(100 / 70)
    assert roof.attainable(0.5, roof.home(19.8e6)) == pytest.approx(35e9)
    assert roof.attainable(0.5) == pytest.approx(10e9)  # DRAM, as before the caches


def test_best_roof_keeps_each_levels_best():
    a = Roofline(20e9, 90e9, "cpu", "float32", caches=(MemoryRoof("L3", 60e9, 32 * 2**20),), cache_notes=("x",))
    b = Roofline(25e9, 80e9, "cpu", "float32", caches=(MemoryRoof("L3", 70e9, 32 * 2**20),), cache_notes=("x",))
    best = best_roof([a, b])
    assert (best.bandwidth_bytes_per_s, best.flops_per_s) == (25e9, 90e9)
    assert best.caches == (MemoryRoof("L3", 70e9, 32 * 2**20),) and best.cache_notes == ("x",)


def test_a_roof_without_caches_still_reads_and_travels():
    """A roof cached before the cache roofs existed (no `caches` attribute state) still works."""
    import json

    import lab.registry  # noqa: F401 -- registers the Lab's types with the wire
    from serving.host.wire import from_json as decode
    from serving.host.wire import to_json as encode

    plain = Roofline(20e9, 100e9, "cpu", "float32")
    assert plain.memory_roofs() == (MemoryRoof("DRAM", 20e9, None),) and plain.home(1e12).name == "DRAM"
    full = Roofline(20e9, 100e9, "cpu", "float32", caches=(MemoryRoof("L3", 70e9, 2**25),), cache_notes=("n",))
    assert decode(json.loads(json.dumps(encode(full)))) == full
