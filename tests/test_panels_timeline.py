"""The panels and the drawing tell one story: TTFT adds up from named parts, E2E is one
number in both, the pot counts only its own steps, a one-token order has no TPOT."""

from __future__ import annotations

import pytest

from engine import Engine
from kitchen_viz.panels import fmt_s, fmt_tps, panel_values, timeline_html, timeline_segments
from kitchen_viz.timeline import LiveRun


@pytest.fixture(scope="module")
def chef():
    return Engine.load("chef")


def cooked(chef, prompts, new) -> LiveRun:
    run = LiveRun.for_order("t", [len(chef.encode(p)) for p in prompts])
    run.consume(list(chef.stream(prompts, max_new_tokens=new, seed=0)))
    return run


def test_ttft_is_setup_plus_the_woks_pass_plus_the_first_sampling_and_e2e_is_shared(chef):
    run = cooked(chef, ["ROMEO:", "JULIET: the night"], 6)
    m = run.result.metrics
    parts = {s.key: s.seconds for s in timeline_segments(run)}
    assert parts["setup"] + parts["wok"] + parts["first"] == pytest.approx(m.ttft_s, abs=1e-9)
    assert sum(parts.values()) == pytest.approx(m.e2e_s, abs=1e-9)
    assert parts["wok"] == pytest.approx(run.prefill_s)  # the drawing's wok timer
    data = run.scene_data()
    assert data["t_done"] == round(m.e2e_s, 5) == data["e2e"]  # the drawing's E2E is the panels'
    html = timeline_html(timeline_segments(run), len(m.itl_s))
    assert f"TTFT {fmt_s(m.ttft_s)}</b>" in html and f"E2E {fmt_s(m.e2e_s)}</b>" in html
    assert "5 decode steps" in html  # 6 tokens: the first from the wok, 5 from the pot


def test_every_table_is_counted_per_step(chef):
    run = cooked(chef, ["ROMEO:"] * 3, 4)
    served = run.scene_data()["served"]
    assert [n for _, n in served] == [3, 6, 9, 12]  # three bowls per step, the first step is the wok's


def test_a_one_token_order_has_no_tpot_and_no_decode_share(chef):
    run = cooked(chef, ["ROMEO:"], 1)
    values = panel_values(run)
    assert values.final and values.tpot_s is None and values.decode_tps is None
    assert fmt_s(values.tpot_s) == "—" and fmt_tps(values.decode_tps) == "—"
    parts = {s.key: s.seconds for s in timeline_segments(run)}
    assert parts["pot"] == 0.0
    assert "no decode step" in timeline_html(timeline_segments(run), 0)


def test_the_bar_names_only_segments_wide_enough_to_hold_their_short_label():
    import re

    from kitchen_viz.panels import Segment, timeline_html

    segments = [Segment("setup", "setup", 0.001, "#999"), Segment("wok", "wok's pass (prefill)", 0.024, "#f60"),
                Segment("first", "first token sampled", 0.0001, "#fb3"), Segment("pot", "soup pot (decode)", 0.093, "#2a9")]  # fmt: skip
    inside = [t for t in re.findall(r"<span>([^<]*)</span>", timeline_html(segments, 31)) if t]
    assert inside == ["pot 93.00 ms"]  # the wok's 20 % would clip "wok 24.0 ms" on a 1024 px projector
    wide = [Segment("setup", "setup", 0.0, "#999"), Segment("wok", "w", 0.05, "#f60"),
            Segment("first", "f", 0.0, "#fb3"), Segment("pot", "p", 0.05, "#2a9")]  # fmt: skip
    assert [t for t in re.findall(r"<span>([^<]*)</span>", timeline_html(wide, 3)) if t] == ["wok 50.00 ms", "pot 50.00 ms"]
