"""Every roofline point under the roof that explains it; none above every roof without a line saying why.

The rule (lab/roof_placement.py) on a roof with stated ceilings (DRAM 20 GB/s, L3 70 GB/s of 32 MB,
L2 100 GB/s of 2 MB, 100 GFLOP/s), then on a real measured run of the chef: its decode points sit
under the roof of the cache its bytes fit in, and the page's line says so.
"""

import itertools

import pytest

from engine.bench.cache_probe import cache_levels
from engine.bench.roofline import MemoryRoof, Roofline
from lab.roof_placement import NOISE_MARGIN, cache_line, cache_mb, place_point
from lab.roofline_lab import RooflineSettings, run_roofline
from tests.conftest import travels

ROOF = Roofline(20e9, 100e9, "cpu", "float32",
                caches=(MemoryRoof("L2", 100e9, 2 * 2**20), MemoryRoof("L3", 70e9, 32 * 2**20)))  # fmt: skip
CHEF_BYTES, ASSISTANT_BYTES = 19.8e6, 538e6


def test_the_assistants_batch_1_step_sits_under_the_dram_roof():
    p = place_point(ROOF, "decode batch 1", 0.5, ASSISTANT_BYTES, 8e9)  # 8 of the 10 GFLOP/s DRAM allows
    assert (p.roof, p.home, p.above_every_roof, p.line) == ("DRAM", "DRAM", False, "")
    assert p.pct_of_roof == pytest.approx(80)


def test_the_chefs_step_above_the_dram_roof_is_under_the_l3_roof_and_the_line_says_why():
    p = place_point(ROOF, "decode batch 1", 0.5, CHEF_BYTES, 15e9)  # 150 % of DRAM's 10 GFLOP/s, under L3's 35
    assert (p.roof, p.home, p.above_every_roof, p.line) == ("L3", "L3", False, "")
    assert p.pct_of_roof == pytest.approx(100 * 15 / 35)
    assert cache_line(ROOF, "chef", CHEF_BYTES, CHEF_BYTES, 15e9, 0.5) == (
        "the chef's 20 MB of weights fit in the 32 MB L3: its pot reads them from cache, so it sits above the DRAM roof"
    )
    below = cache_line(ROOF, "chef", CHEF_BYTES, CHEF_BYTES, 8e9, 0.5)
    assert below.endswith("so its ceiling is the L3 roof, not the DRAM roof")
    assert cache_line(ROOF, "assistant", ASSISTANT_BYTES, ASSISTANT_BYTES, 8e9, 0.5) == (
        "the assistant's 538 MB of weights do not fit in the 32 MB L3: its pot reads them from DRAM at every step, "
        "so it sits under the DRAM roof"
    )
    assert cache_line(Roofline(20e9, 100e9, "cpu", "float32"), "chef", CHEF_BYTES, CHEF_BYTES, 15e9, 0.5) == ""


def test_a_big_step_above_its_dram_roof_is_named_and_placed_under_the_next_roof():
    p = place_point(ROOF, "decode batch 1", 0.5, ASSISTANT_BYTES, 15e9)
    assert (p.roof, p.home, p.above_every_roof) == ("L3", "DRAM", False)
    assert p.line.startswith("decode batch 1 ran at 150% of the DRAM roof its 538 MB come through")
    assert "or the DRAM roof was measured in a slower moment" in p.line


def test_above_every_roof_is_a_named_artefact():
    p = place_point(ROOF, "decode batch 1", 0.5, CHEF_BYTES, 60e9)  # L2 allows 50
    assert p.above_every_roof and p.roof == "L2" and p.pct_of_roof == pytest.approx(120)
    assert "is drawn above every roof (120% of the L2 roof, the highest here)" in p.line
    assert "measurement artefact" in p.line
    near = place_point(ROOF, "decode batch 1", 0.5, CHEF_BYTES, 52e9)
    assert near.above_every_roof and "within the roofs' measurement noise (10%)" in near.line
    flat = place_point(ROOF, "prefill prompt 16", 50.0, CHEF_BYTES, 120e9)  # every roof is the 100 GFLOP/s one here
    assert flat.above_every_roof and flat.roof == "L3" and "of the compute roof (100.0 GFLOP/s" in flat.line


@pytest.mark.parametrize("roof", [ROOF, Roofline(20e9, 100e9, "cpu", "float32")], ids=["caches", "dram-only"])
def test_the_rule_never_leaves_a_point_above_its_roof_unexplained(roof):
    intensities = (0.1, 0.5, 2.0, 8.0, 64.0)
    sizes = (1e6, CHEF_BYTES, 40e6, ASSISTANT_BYTES)
    speeds = (1e8, 5e9, 12e9, 30e9, 45e9, 60e9, 99e9, 130e9)
    for intensity, nbytes, achieved in itertools.product(intensities, sizes, speeds):
        p = place_point(roof, "pass", intensity, nbytes, achieved)
        top = max(roof.attainable(intensity, m) for m in roof.memory_roofs())
        assert p.above_every_roof == (achieved > top)
        if p.above_every_roof or p.roof != p.home:
            assert p.line, (intensity, nbytes, achieved)  # never silent
        else:
            assert achieved <= p.attainable_flops_per_s * (1 + NOISE_MARGIN) and not p.line
        assert p.pct_of_roof == pytest.approx(100 * achieved / p.attainable_flops_per_s)


def test_the_chefs_measured_decode_sits_under_its_caches_roof(chef_one_thread):
    if not cache_levels():
        pytest.skip("this machine reports no cache sizes: only the DRAM roof is drawn")
    r = run_roofline(chef_one_thread, RooflineSettings(prompt_lens=(16,), batches=(1,), new_tokens=4))
    travels(r)
    (decode,) = [p for p in r.points if p.phase == "decode"]
    home = r.roof.home(decode.bytes_moved)
    weights = chef_one_thread.info.weight_bytes
    assert home.name != "DRAM", (decode.bytes_moved, r.roof.caches, r.roof.cache_notes)  # 20 MB fit in the L3
    fits = f"the chef's {weights / 1e6:.0f} MB of weights fit in the {cache_mb(home.capacity_bytes)} {home.name}"
    assert r.notes[0].startswith(fits + ": its pot reads them from cache, so ")
    for p in r.points:
        assert p.roof == r.roof.home(p.bytes_moved).name or p.line
        assert not p.above_every_roof or any(p.line == n for n in r.notes)
    assert any(n.startswith("roofs measured in this run: ") for n in r.notes)
