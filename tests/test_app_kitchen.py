"""AppTest on the entry point and the Kitchen: it renders, Cook measures real text, refusals are lines.

Note: with `st.navigation`, AppTest drops the sidebar's widgets from its element tree after the
first run (the real app keeps them), so tests set the shared controls through their
session-state keys, exactly the values the sidebar widgets would write. Presenter mode is
checked in the real browser (tests/test_browser.py).

The app runs exactly as a browser session would (app.py -> st.navigation -> pages/kitchen.py)
with the real engine on the embedded chef. The worker thread cooks between script runs, so a
test waits on the job and then reruns the script, as the page's fragment would.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from app_kit import open_kitchen
from conftest import CHEF_CONTEXT, use_settings
from streamlit.testing.v1 import AppTest

from serving.host_client import weights_megabytes

APP = str(Path(__file__).resolve().parent.parent / "kitchen_viz" / "web" / "app.py")
WAIT_S = 120


def cook_button(at: AppTest):
    return next(b for b in at.button if "Cook" in b.label)


def finish(at: AppTest) -> AppTest:
    job = at.session_state["tpk_job"]
    assert job.wait(WAIT_S), "the order did not finish in time"
    at.run()
    return at


def test_first_load_says_what_is_loading():
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["tpk_model"] = "chef"
    at.session_state["tpk_dtype"] = "bfloat16"  # a kitchen no other test has warmed up
    at.run()
    assert not at.exception
    lines = [i.value for i in at.info]
    if lines:  # it may already be loaded if this test runs late
        assert "loading weights" in lines[0] and "MB of chef on cpu (bfloat16)" in lines[0]


def test_the_kitchen_renders_with_controls_and_both_panels():
    at = open_kitchen()
    labels = [s.label for s in at.slider]
    assert any("Prompt length" in x for x in labels) and any("batch size" in x for x in labels)
    assert any("Max new tokens" in x for x in labels) and any("Temperature" in x for x in labels)
    metrics = [m.label for m in at.metric]
    assert "TTFT" in metrics and any(m.startswith("TPOT") for m in metrics) and "E2E" in metrics
    assert any(f"context is {CHEF_CONTEXT:,} tokens" in c.value for c in at.caption)  # the limit's reason is shown


def test_cook_produces_text_and_measured_ttft_and_tpot():
    at = open_kitchen()
    at.toggle(key="tpk_live").set_value(True).run()  # the live fragment path, whatever the core count
    at.slider(key="tpk_batch").set_value(2)
    at.slider(key="tpk_new").set_value(8)
    at.run()
    cook_button(at).click().run()
    finish(at)
    assert not at.exception
    result = at.session_state["tpk_result"]
    assert len(result["texts"]) == 2 and all(t.strip() for t in result["texts"])
    assert result["ttft_s"] > 0 and result["tpot_s"] > 0 and result["e2e_s"] >= result["ttft_s"]
    assert any("Diagnosis" in i.value for i in at.info)  # the inspector names the slower pot
    shown = [m.value for m in at.metric]
    assert all(v != "—" for v in shown)


def test_a_written_prompt_cooks_for_every_table():
    at = open_kitchen()
    at.radio(key="tpk_mode").set_value("Write a prompt").run()
    at.text_area(key="tpk_text").set_value("JULIET:\n").run()
    at.slider(key="tpk_new").set_value(4).run()
    cook_button(at).click().run()
    finish(at)
    assert at.session_state["tpk_result"]["texts"]


def test_with_the_live_view_off_the_page_waits_quietly_and_shows_the_result():
    at = open_kitchen()
    at.toggle(key="tpk_live").set_value(False).run()
    at.slider(key="tpk_new").set_value(6).run()
    cook_button(at).click().run()  # this run waits for the order, then reruns once
    assert not at.exception
    assert at.session_state["tpk_job"].finished
    result = at.session_state["tpk_result"]
    assert result["texts"][0] and result["ttft_s"] > 0 and result["tpot_s"] > 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", "empty"), ("word " * (CHEF_CONTEXT + 200), "context")],
)
def test_invalid_prompts_show_the_reason_not_a_traceback(text, expected):
    at = open_kitchen()
    at.radio(key="tpk_mode").set_value("Write a prompt").run()
    at.text_area(key="tpk_text").set_value(text).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("This order can't be cooked:") and expected in errors[0]
    # nothing to cook until it is fixed, but every control keeps its place (no layout jump)
    assert [b.disabled for b in at.button if "Cook" in b.label] == [True]
    assert at.slider(key="tpk_batch") is not None and at.toggle(key="tpk_live") is not None


def test_a_longer_reply_lowers_the_prompt_length_and_says_why():
    at = open_kitchen()
    at.slider(key="tpk_prompt_len").set_value(CHEF_CONTEXT - 100).run()
    at.slider(key="tpk_new").set_value(300).run()
    assert not at.exception
    assert at.slider(key="tpk_prompt_len").value == CHEF_CONTEXT - 300
    assert any("lowered" in w.value and f"context is {CHEF_CONTEXT:,}" in w.value for w in at.warning)


def test_a_model_that_cannot_load_shows_one_line(tmp_path, monkeypatch):
    """An instructor's hub entry on a machine without internet: the page says why, in one line."""
    extra = tmp_path / "extra.toml"
    extra.write_text('[[model]]\nname = "offline-hub"\nhub = "nobody-here/not-a-model"\nlabel = "Offline"\n')
    use_settings(monkeypatch, catalogs=(str(extra),))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = open_kitchen()
    at.session_state["tpk_model"] = "offline-hub"  # what the sidebar's model picker sets
    at.run()
    deadline = time.monotonic() + WAIT_S
    while not at.error and time.monotonic() < deadline:
        time.sleep(0.3)
        at.run()
    assert not at.exception
    assert "Could not open this kitchen" in at.error[0].value and "not-a-model" in at.error[0].value
    assert "\n" not in at.error[0].value


def test_a_broken_instructor_catalog_is_one_line_and_the_chef_still_opens(tmp_path, monkeypatch):
    extra = tmp_path / "extra.toml"
    extra.write_text('[[model]]\nname = "typo"\npaht = "/srv/models/x"\n')
    use_settings(monkeypatch, catalogs=(str(extra),))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    problems = [e.value for e in at.error if e.value.startswith("Model catalog:")]
    assert len(problems) == 1 and "\n" not in problems[0], [e.value for e in at.error]
    assert "paht" in problems[0]  # the refusal names the offending key


def test_int8_precision_cooks_and_says_so():
    """Precision "int8" in the sidebar: the kitchen loads int8 matrices and every figure says int8."""
    at = open_kitchen(state={"tpk_dtype": "int8"})
    caption = next(c.value for c in at.caption if "MB of weights" in c.value)
    int8_mb = float(re.search(r"([\d.]+) MB of weights", caption).group(1))
    # Q8_0 blocks: 1 byte a weight + a 2-byte scale per 32 (1.0625 bytes), against 4 in float32; the
    # norms stay float32, so the chef's whole file is about 0.37 of float32's 19.8 MB
    assert "(int8)" in caption and 0.3 < int8_mb / weights_megabytes("chef", "float32") < 0.45, caption
    at.slider(key="tpk_new").set_value(8).run()
    cook_button(at).click().run()
    finish(at)
    assert not at.exception
    result = at.session_state["tpk_result"]
    assert result["tpot_s"] > 0 and all(t.strip() for t in result["texts"])
    assert at.session_state["tpk_job"].result.dtype == "int8"  # the run log and dashboard keep it apart


def test_the_page_says_when_the_machine_was_busy_as_the_order_cooked():
    import os

    at = open_kitchen()
    at.slider(key="tpk_new").set_value(4).run()
    cook_button(at).click().run()
    finish(at)
    load = at.session_state["tpk_load"]
    busy = [c.value for c in at.caption if "This machine was busy while the order cooked" in c.value]
    assert bool(busy) == (load is not None and load > os.cpu_count())  # said exactly when it was
    if busy:
        assert f"load {load:.1f} on {os.cpu_count()} cores" in busy[0]
