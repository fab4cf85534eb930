"""The scene's data: real engine events folded into a timeline, the slow-motion choice, the limits.

The timeline is built from a real run of the chef (no invented events); the slow-motion rule and
the prompt builder are pure arithmetic, checked on worked examples.
"""

from __future__ import annotations

import json

import pytest

from engine import Engine
from engine.events import Done
from kitchen_viz.orders import MAX_TABLES, Order, control_limits
from kitchen_viz.panels import fmt_s, panel_values
from kitchen_viz.scene import scene_sources
from kitchen_viz.timeline import MAX_REPLAY_S, SCENE_TABLES, LiveRun, choose_slowdown, slowdown_label
from serving.host.api import generated_prompts
from serving.host.loop import order_prompts


@pytest.fixture(scope="module")
def chef():
    return Engine.load("chef")


@pytest.fixture(scope="module")
def events(chef):
    return list(chef.stream(["ROMEO:", "JULIET: the night"], max_new_tokens=8, seed=0))


def test_folding_events_in_pieces_equals_folding_them_at_once(events):
    whole = LiveRun("a")
    whole.consume(events)
    parts = LiveRun("a")
    for cut in (1, 3, 4, 9, len(events)):  # the fragment sees growing prefixes of the same list
        parts.consume(events[:cut])
    assert parts.seen == whole.seen == len(events)
    assert parts.scene_data() == whole.scene_data()


def test_the_timeline_matches_the_engines_own_metrics(events):
    run = LiveRun("a")
    run.consume(events)
    res = events[-1].result
    assert isinstance(events[-1], Done)
    assert run.batch == 2 and run.prompt_tokens == res.prompt_tokens
    assert run.text == res.texts
    assert run.t_first_token == pytest.approx(res.metrics.ttft_s)
    assert run.prefill_s == pytest.approx(res.trace.prefill.seconds)
    assert len(run.decode_steps) == len(res.trace.decode_steps) == 7
    assert run.itl_s == res.metrics.itl_s
    assert run.slowdown is not None and run.slowdown >= 1


def test_scene_data_is_compact_json_ordered_in_time(events):
    run = LiveRun("a")
    run.consume(events)
    data = json.loads(json.dumps(run.scene_data(presenter=True, wok_capacity=4096)))
    assert data["presenter"] is True and data["shown_tables"] == 2
    start, end = data["prefill"]
    assert 0 <= start < end <= data["t_first"] <= data["t_done"]
    step_ends = [s[1] for s in data["steps"]]
    assert step_ends == sorted(step_ends) and step_ends[-1] <= data["t_done"]
    kv = [s[2] for s in data["steps"]]
    assert kv == sorted(kv) and kv[0] > data["kv_handed"] > 0  # the counter grows one token per step
    for seq in data["tokens"]:
        times = [t for t, _ in seq]
        assert times == sorted(times) and len(seq) == 8


def test_panels_show_provisional_numbers_then_the_engines_metrics(events):
    run = LiveRun("a")
    assert panel_values(run).ttft_s is None
    cut = next(i for i, e in enumerate(events) if type(e).__name__ == "StepEnd" and e.step.phase == "decode")
    run.consume(events[: cut + 1])
    live = panel_values(run)
    assert not live.final and live.ttft_s > 0 and live.tpot_s > 0 and live.e2e_s is None
    run.consume(events)
    final = panel_values(run)
    m = events[-1].result.metrics
    assert final.final and (final.ttft_s, final.tpot_s, final.e2e_s) == (m.ttft_s, m.tpot_s, m.e2e_s)


def test_only_the_first_tables_are_drawn_but_all_are_counted(chef):
    batch = SCENE_TABLES + 3
    evs = list(chef.stream(generated_prompts(list(range(5, 50)), 4, batch), max_new_tokens=2, seed=0))
    run = LiveRun("b")
    run.consume(evs)
    data = run.scene_data()
    assert data["batch"] == batch and data["shown_tables"] == SCENE_TABLES
    assert len(data["tokens"]) == SCENE_TABLES and len(run.text) == batch


@pytest.mark.parametrize(
    ("prefill_s", "itl_s", "e2e_s", "expected"),
    [
        (0.010, 0.003, 0.2, 100),  # wok needs 60x, ladle 50x -> the next nice factor, 100
        (0.800, 0.200, 5.0, 1),  # slow enough to watch at real speed
        (0.002, 0.001, 0.5, 50),  # 300x wanted, but 40 s / 0.5 s caps it at 80 -> rounded down to 50
        (0.010, None, 0.010, 100),  # one token only: the wok alone decides
    ],
)
def test_slowdown_makes_the_fastest_step_visible_within_the_replay_cap(prefill_s, itl_s, e2e_s, expected):
    factor = choose_slowdown(prefill_s, itl_s, e2e_s)
    assert factor == expected
    assert factor == 1 or factor * e2e_s <= MAX_REPLAY_S


def test_slowdown_label_says_how_much_slower():
    assert slowdown_label(1) == "real speed"
    assert slowdown_label(2000) == "×2,000 slower than real"


def test_generated_prompts_cut_the_filler_at_different_lines():
    assert generated_prompts(list(range(1, 11)), 4, 2) == [[1, 2, 3, 4], [8, 9, 10, 1]]
    with pytest.raises(ValueError, match="encoded to no tokens"):
        generated_prompts([], 4, 1)


def test_control_limits_come_from_the_engine(chef):
    lim = control_limits(chef.limits(100, 64), 100, 64)
    assert lim.max_context == chef.info.max_context
    assert lim.max_prompt_tokens == chef.info.max_context - 64
    assert 1 <= lim.max_batch <= MAX_TABLES
    tight = chef.limits(100, 64)
    tight_budget = type(tight)(
        2,
        tight.max_context,
        2 * tight.kv_bytes_per_sequence,
        tight.kv_bytes_per_token,
        tight.kv_bytes_per_sequence,
    )
    small = control_limits(tight_budget, 100, 64)
    assert small.max_batch == 2 and "KV budget" in small.batch_reason and "MB" in small.batch_reason


def test_an_order_builds_its_prompts_with_the_engines_tokenizer(chef):
    written = Order(batch=2, max_new_tokens=4, temperature=0.0, seed=0, text="ROMEO:")
    assert order_prompts(chef, written.form()) == ["ROMEO:", "ROMEO:"]
    generated = Order(batch=3, max_new_tokens=4, temperature=0.0, seed=0, prompt_tokens=25)
    prompts = order_prompts(chef, generated.form())
    assert [len(p) for p in prompts] == [25, 25, 25] and len({tuple(p) for p in prompts}) == 3


def test_the_scene_inlines_our_svg_into_its_script():
    css, js = scene_sources()
    assert "__KITCHEN_SVG__" not in js and "tpk-wok-fill" in js and "prefers-reduced-motion" in js
    assert ".tpk-root" in css and "prefers-reduced-motion" in css


def test_times_read_in_ms_below_a_second():
    assert (fmt_s(None), fmt_s(0.0123), fmt_s(0.25), fmt_s(2.5)) == ("—", "12.30 ms", "250.0 ms", "2.50 s")
