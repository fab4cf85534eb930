"""Smaller portions (lab/smaller_portions.py) on the chef: every variant measured, refusals in one
line. Which variant is faster is what the page measures, so no timing is asserted here."""

import pytest
from conftest import CHEF_CONTEXT, travels

from engine import Engine, EngineError
from lab.smaller_portions import PortionSettings, run_portions

SMALL = PortionSettings(prompt_len=8, new_tokens=3, prefill_tokens=16, repeats=1, agreement_tokens=8)


@pytest.fixture(scope="module")
def chef():
    return Engine.load("chef")


def test_every_variant_is_measured_and_compared_with_float32(chef):
    steps = []
    r = run_portions(chef, SMALL, on_progress=lambda *a: steps.append(a))
    travels(r)
    assert [p.variant for p in r.points] == ["float32", "bfloat16", "int8"] and steps
    assert all(p.decode_step_s > 0 and p.prefill_s > 0 for p in r.points)
    f32, b16, i8 = r.points
    assert i8.weight_mb < b16.weight_mb < f32.weight_mb
    assert f32.greedy_prefix == 8 and 0 <= i8.greedy_prefix <= 8
    # llama.cpp's measures on float32's continuation: positions 8..14 of the 16 tokens predict 9..15
    assert f32.fidelity.kl_mean == pytest.approx(0.0, abs=1e-9) and f32.fidelity.top1 == 1.0
    assert i8.fidelity.positions == 7 and i8.fidelity.kl_max >= i8.fidelity.kl_mean >= 0.0
    assert 0.0 <= i8.fidelity.top1 <= 1.0 and i8.fidelity.ppl_ratio > 0
    assert any(n.startswith("int8 against float32 on float32's own continuation (7 positions)") for n in r.notes)
    assert r.to_frame().kl_vs_float32.iloc[2] == i8.fidelity.kl_mean
    assert r.decode_speedup == f32.decode_step_s / i8.decode_step_s
    assert r.sample.label == "int8 weights" and len(r.notes) >= 4  # the inspector judges the int8 run
    assert list(r.to_frame().variant) == ["float32", "bfloat16", "int8"]
    for p in r.points:  # repeats=1 asked, three measured: every bar is a median of three with its range
        for s in (p.decode, p.prefill):
            assert s.n == 3 and s.low <= s.median <= s.high
        assert (p.decode.median, p.prefill.median) == (p.decode_step_s, p.prefill_s)
    said = [n for n in r.notes if n.startswith(("decode step:", "prefill:")) or n.startswith("too noisy")]
    assert len(said) == 2  # one finding or one "too noisy" line each for decode and prefill


def test_faster_is_withheld_when_float32_and_int8_ranges_overlap():
    from lab.noise import Machine, Spread
    from lab.smaller_portions import faster_finding

    busy = Machine(line="something else used the cores", load=2.7, cores=2, wall_s=1.0)
    f32, overlap, apart = Spread(0.010, 0.008, 0.014, 3), Spread(0.007, 0.005, 0.009, 3), Spread(0.003, 0.002, 0.004, 3)
    said = faster_finding("decode step", f32, overlap, busy)
    assert said.startswith("too noisy to say whether int8's decode step is faster")
    assert "the machine was busy (load 2.7)" in said
    assert faster_finding("decode step", f32, apart, busy) == (
        "decode step: int8 is faster than float32 by more than the repeats vary")


@pytest.mark.parametrize(
    "settings, words",
    [
        (PortionSettings(variants=("float32", "bfloat16")), "must include float32 and int8"),
        (PortionSettings(variants=("float32", "int4")), "must include float32 and int8"),
        (PortionSettings(new_tokens=1), "new_tokens >= 2"),
        (PortionSettings(prefill_tokens=CHEF_CONTEXT + 88), f"the model's context is {CHEF_CONTEXT}"),
    ],
)
def test_bad_settings_are_refused_in_one_line(chef, settings, words):
    with pytest.raises(EngineError, match=words) as err:
        run_portions(chef, settings)
    assert "\n" not in str(err.value)


def test_the_page_runs_through_the_kitchen_and_draws_both_charts(tmp_path, monkeypatch):
    """The page with its defaults on the chef, through the app's engine process."""
    from app_kit import lab_page_test

    monkeypatch.setenv("TWO_POT_LAB_CACHE", str(tmp_path / "lab-cache"))
    at = lab_page_test("portions")
    at.run()
    at.number_input(key="portions-guess").set_value(2.0).run()
    next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 2 and len(at.dataframe) == 1
    assert set(at.dataframe[0].value["variant"]) == {"float32", "bfloat16", "int8"}
