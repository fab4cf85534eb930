""""Make the wok win": an order sized from the model's limits and this machine's measured rates."""

from __future__ import annotations

import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from kitchen_viz.wok_win import FEWEST_NEW, TARGET_SHARE, Rates, wok_win_order

APP = str(Path(__file__).resolve().parent.parent / "kitchen_viz" / "web" / "app.py")


def chef_like(context: int):
    return lambda new: context - new  # the prompt ceiling when the context decides


def test_before_anything_is_measured_the_pot_gets_one_step_and_the_prompt_is_the_longest():
    plan = wok_win_order(chef_like(512), 511, None)
    assert (plan.prompt, plan.batch, plan.new, plan.predicted_share) == (510, 1, FEWEST_NEW, None)
    assert "nothing measured yet" in plan.why


def test_the_worked_example_sizes_new_tokens_from_the_rates():
    plan = wok_win_order(chef_like(512), 511, Rates(1400.0, 0.004, "your last order"))
    assert (plan.prompt, plan.new) == (481, 31)
    assert TARGET_SHARE - 0.02 < plan.predicted_share < TARGET_SHARE + 0.01
    assert "from your last order (wok 1,400 tok/s, TPOT 4.00 ms)" in plan.why


def test_a_longer_context_gives_a_longer_prompt_and_more_new_tokens():
    short = wok_win_order(chef_like(512), 511, Rates(1400.0, 0.004, "x"))
    long = wok_win_order(chef_like(2048), 2047, Rates(1400.0, 0.004, "x"))
    assert long.prompt > short.prompt and long.new > short.new
    assert long.predicted_share >= TARGET_SHARE - 0.02


def test_a_slow_pot_still_gets_at_least_one_step_and_the_caps_hold():
    plan = wok_win_order(chef_like(512), 511, Rates(100_000.0, 1.0, "x"))  # a very fast wok, a slow pot
    assert plan.new == FEWEST_NEW
    capped = wok_win_order(lambda new: 256, 8, Rates(10.0, 0.001, "x"))  # an instructor's caps
    assert capped.prompt == 256 and capped.new == 8


def run_until(at: AppTest, done, timeout_s: float = 120) -> AppTest:
    deadline = time.monotonic() + timeout_s
    while not done(at) and time.monotonic() < deadline:
        time.sleep(0.3)
        at.run()
    assert not at.exception, at.exception
    return at


def click_and_cook(at: AppTest) -> AppTest:
    at.button(key="tpk-wok-win").click().run()
    job = at.session_state["tpk_job"]
    assert job.wait(120) and job.error is None, job.error
    return run_until(at.run(), lambda a: a.session_state["tpk_result"] is not None)


def test_one_click_cooks_the_longest_prompt_and_the_wok_wins():
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["tpk_live"] = False
    run_until(at.run(), lambda a: bool(a.button))
    click_and_cook(at)
    plen = at.slider(key="tpk_prompt_len")
    assert plen.value == plen.max and at.slider(key="tpk_new").value == FEWEST_NEW
    result = at.session_state["tpk_result"]
    assert result["ttft_s"] / result["e2e_s"] >= 0.6  # the longest prompt against one decode step
    assert any("the wok is the bottleneck" in i.value for i in at.info)
    click_and_cook(at)  # now sized from what the first order measured
    assert at.slider(key="tpk_new").value >= FEWEST_NEW
    assert "from your last order" in at.button(key="tpk-wok-win").help
