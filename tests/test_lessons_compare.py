"""Teacher features: the suggested-orders lesson plan and comparing two orders."""

from __future__ import annotations

import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from kitchen_viz.lessons import LESSONS, LONGEST, plan_markdown, query
from kitchen_viz.orders import MAX_TABLES

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "kitchen_viz" / "web" / "app.py")


def test_every_lesson_is_an_order_the_chef_accepts():
    assert 5 <= len(LESSONS) <= 7
    for lesson in LESSONS:
        for order in filter(None, (lesson.order, lesson.compare_with)):
            prompt = 1 if order["prompt"] == LONGEST else order["prompt"]  # the Kitchen sizes "longest"
            assert prompt + order["new"] <= 512 and 1 <= order["batch"] <= MAX_TABLES
            assert 0 <= order["temp"] <= 2


def test_the_first_two_lessons_put_each_pot_forward_and_one_asks_for_leftovers():
    pot, wok = LESSONS[0].order, LESSONS[1].order
    assert pot["prompt"] != LONGEST and pot["new"] > pot["prompt"]  # a short prompt, a long reply
    assert wok["prompt"] == LONGEST and wok["new"] < pot["new"]  # the longest prompt, a short reply
    assert [lesson.order.get("reuse") for lesson in LESSONS].count(1) == 1


def test_a_lesson_asking_for_the_longest_prompt_gets_the_ceiling_without_a_warning():
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(query(LESSONS[1].order, 2))
    run_until(at.run(), lambda a: bool(a.button))
    assert at.slider(key="tpk_prompt_len").value == at.slider(key="tpk_prompt_len").max
    assert not [w.value for w in at.warning if "Prompt length" in w.value]
    assert at.toggle(key="tpk_reuse").value is False


def test_the_plan_prints_as_markdown_with_a_link_per_lesson():
    text = plan_markdown("http://localhost:8501")
    assert text.count("\n## ") == len(LESSONS)
    assert "http://localhost:8501/?prompt=32&batch=1&new=64&temp=0&model=assistant&lesson=1" in text
    assert text.count("- **Model:** On the assistant: ") == 2 and "- **Model:** On the chef: " in text
    assert "ms" not in text.replace("tokens", "")  # the plan names no measured number


def test_the_lessons_page_links_each_order_to_the_kitchen():
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/lessons.py").run()  # through the app's navigation, as a browser gets it
    assert not at.exception, at.exception
    assert len(at.get("download_button")) == 1
    links = at.get("page_link")
    assert len(links) == len(LESSONS) + sum(1 for lesson in LESSONS if lesson.compare_with)


def run_until(at: AppTest, done, timeout_s: float = 120) -> AppTest:
    deadline = time.monotonic() + timeout_s
    while not done(at) and time.monotonic() < deadline:
        time.sleep(0.3)
        at.run()
    assert not at.exception, at.exception
    return at


def cook(at: AppTest) -> AppTest:
    next(b for b in at.button if "Cook" in b.label).click().run()
    job = at.session_state["tpk_job"]
    assert job.wait(120)
    return at.run()


def test_a_lesson_link_applies_in_a_session_that_already_has_an_order_then_two_orders_compare():
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(query({"prompt": 16, "batch": 1, "new": 4, "temp": 0}, 1))
    run_until(at.run(), lambda a: bool(a.button))
    assert at.slider(key="tpk_prompt_len").value == 16
    cook(at)
    at.query_params.update(
        query({"prompt": 40, "batch": 2, "new": 4, "temp": 0}, 2)
    )  # the next lesson's link
    at.run()
    assert at.slider(key="tpk_prompt_len").value == 40 and at.slider(key="tpk_batch").value == 2
    cook(at)
    history = at.session_state["tpk_history"]
    assert [o.label.split(":")[0] for o in history] == ["#1", "#2"]
    assert history[0].label.startswith("#1: prompt 16 × 1 table, 4 new")
    assert history[1].label.startswith("#2: prompt 40 × 2 tables, 4 new")
    assert at.selectbox(key="tpk-compare-a").value == history[0].label
    assert at.selectbox(key="tpk-compare-b").value == history[1].label
    ttft = [m.value for m in at.metric if m.label in ("TTFT", "TTFT, every table")]
    assert len(ttft) == 3  # the panels' ("TTFT, every table": 2 tables) and both compared orders'
