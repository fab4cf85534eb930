"""The two kitchens experiment's compute function, headless on the real chef."""

from __future__ import annotations

import pytest
from conftest import CHEF_CONTEXT, travels

from engine import Engine, EngineError
from lab.two_kitchens_lab import TwoKitchensSettings, computed_transfer_s, run_two_kitchens_lab


def test_two_kitchens_on_the_chef_split_ttft_and_keep_the_tokens():
    eng = Engine.load("chef")
    seen = []
    res = run_two_kitchens_lab(eng, TwoKitchensSettings(orders=3, short_prompt=8, long_prompt=96, new_tokens=8,
                                                        gap_ms=30), seen.append)  # fmt: skip
    travels(res)
    assert [p.done for p in seen] == [1, 2, 3]
    cfg = eng.cfg
    assert res.kv_bytes_per_token == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4 == 6144
    assert res.kv_formula == "2 x 6 layers x 4 KV heads x 32 x 4 B"
    assert res.same_tokens and [o.prompt_tokens for o in res.two] == [8, 96, 8]
    for run, n in zip(res.handoffs, (8, 96), strict=True):
        assert run.round_trip_exact and run.prompt_tokens == n and run.kv_bytes == n * 6144
        assert run.ttft_s == pytest.approx(run.prefill_s + run.transfer_s + run.first_decode_s)
    hand = res.handoff_frame()
    assert list(hand.transfer_over_predicted) == pytest.approx(list(hand.transfer_s / hand.predicted_transfer_s))
    one, two = res.summary()
    assert one.kitchens == "one kitchen" and one.gaps == two.gaps == 3 * 6  # 8 tokens: 6 gaps after the first decode
    assert res.worst_gap_ratio == pytest.approx(one.max_ms / two.max_ms)
    assert len(res.stream_frame()) == 6 and len(res.to_frame()) == 2


def test_the_what_if_is_bytes_over_bandwidth():
    assert computed_transfer_s(2_000_000, 1e9) == pytest.approx(0.002)


@pytest.mark.parametrize("bad, limit", [({"orders": 1}, "2..16 orders"), ({"long_prompt": CHEF_CONTEXT + 88}, f"context is {CHEF_CONTEXT}"),
                                        ({"short_prompt": 0}, "short prompt"), ({"threads": 0}, "threads >= 1")])  # fmt: skip
def test_bad_settings_are_refused_in_one_line(bad, limit):
    with pytest.raises(EngineError, match=limit):
        run_two_kitchens_lab(Engine.load("chef"), TwoKitchensSettings(**bad))


def test_the_inspector_sees_the_steadier_pot_and_a_transfer_off_its_prediction():
    from lab.serving_verdicts import diagnose_two_kitchens

    v = diagnose_two_kitchens(0.045, 0.004, 0.006, 0.0009, 0.0005, 0.06)
    assert "kept the pot steady" in v.headline and "7.5x its usual" in v.evidence[0]
    assert "1.80x the link's prediction" in v.evidence[1] and not any("rerun" in f for f in v.fixes)
    v = diagnose_two_kitchens(0.005, 0.005, 0.004, 0.003, 0.001, 0.06)
    assert "did not steady" in v.headline and any("3.00x" in f and "rerun" in f for f in v.fixes)


def test_the_page_runs_through_the_kitchen_and_shows_charts_tables_and_verdict(tmp_path, monkeypatch):
    """The page with its defaults on the chef, through the app's engine process (which starts the two kitchens)."""
    from app_kit import lab_page_test

    monkeypatch.setenv("TWO_POT_LAB_CACHE", str(tmp_path / "lab-cache"))
    at = lab_page_test("two_kitchens")
    at.run()
    at.number_input(key="two_kitchens-guess").set_value(5.0).run()
    next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    charts = at.get("plotly_chart")
    assert len(charts) == 4 and len(at.dataframe) == 4
    assert "computed, not measured" in charts[3].proto.spec.lower()
    assert "second kitchen" in at.info[0].value
