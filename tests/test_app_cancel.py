"""AppTest on the Kitchen: the instructor's caps are shown and enforced, and Cancel stops an order.

Runs the app as a browser session would (app.py -> pages/kitchen.py) with the real engine on the
embedded chef. Closing the page is checked in a real browser (tests/test_browser_cancel.py).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from app_kit import open_kitchen
from conftest import use_settings
from streamlit.testing.v1 import AppTest

from engine.events import Token
from serving.host.loop import TEST_HANG_ENV

APP = str(Path(__file__).resolve().parent.parent / "kitchen_viz" / "web" / "app.py")
WAIT_S = 120

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def cook(at: AppTest) -> AppTest:
    return next(b for b in at.button if "Cook" in b.label).click().run()


def test_the_caps_are_shown_and_an_order_over_one_is_refused_in_one_line(tmp_path, monkeypatch):
    caps = tmp_path / "caps.toml"
    caps.write_text("[caps]\nmax_order_tokens = 20\nmax_order_seconds = 45\n")
    use_settings(monkeypatch, caps=str(caps))
    # The kitchen host reads the caps when it opens: a kitchen no other test opens obeys this file.
    at = open_kitchen(state={"tpk_model": "chef", "tpk_dtype": "float16"})
    shown = [c.value for c in at.caption if c.value.startswith("Instructor's limits per order")]
    assert len(shown) == 1 and "20 prompt tokens" in shown[0] and "45 s of cooking" in shown[0]
    # The sliders already stop at the caps (kitchen_ui.order_ui); a written prompt is counted once
    # written, by the host's check, which applies the caps too: the form says why and Cook stays off.
    at.radio(key="tpk_mode").set_value("Write a prompt").run()
    at.text_area(key="tpk_text").set_value("ROMEO:\nO, she doth teach the torches to burn bright!\n").run()
    assert not at.exception, at.exception
    refusals = [e.value for e in at.error if "max_order_tokens" in e.value]
    assert len(refusals) == 1 and "\n" not in refusals[0], [e.value for e in at.error]
    tokens = int(re.search(r"has (\d+) prompt tokens \(1 table\)", refusals[0]).group(1))
    assert tokens > 20 and "limit is 20 tokens per order" in refusals[0]
    assert next(b for b in at.button if "Cook" in b.label).disabled
    assert "tpk_job" not in at.session_state  # refused before it joined the queue


def test_cancel_stops_a_cooking_order_and_the_page_says_so(monkeypatch):
    # The engine pauses 20 ms after every step (its test hook), so the order is still cooking when
    # Cancel is pressed however fast this machine is; a kitchen no other test opens.
    monkeypatch.setenv(TEST_HANG_ENV, "0.02")
    at = open_kitchen(state={"tpk_model": "apprentice", "tpk_dtype": "bfloat16"})
    at.toggle(key="tpk_live").set_value(True).run()  # followed live: the page returns while it cooks
    at.slider(key="tpk_prompt_len").set_value(8)
    at.slider(key="tpk_new").set_value(500)
    at.run()
    at.slider(key="tpk_batch").set_value(64)
    at.run()
    assert not [b for b in at.button if b.key == "tpk_cancel"]  # nothing to cancel yet
    cook(at)
    assert not at.exception, at.exception
    job = at.session_state["tpk_job"]
    cancel = [b for b in at.button if b.key == "tpk_cancel"]
    assert len(cancel) == 1 and "Cancel" in cancel[0].label
    deadline = time.monotonic() + WAIT_S
    while not any(isinstance(e, Token) for e in job.events) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not job.finished, job.error  # 64 tables x 500 tokens: still cooking when Cancel is pressed
    cancel[0].click().run()
    assert job.wait(15) and job.status == "cancelled"
    at.run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error if "cancelled" in e.value] == ["Order cancelled: you pressed Cancel."]  # the 🛑 becomes the icon
    assert not [b for b in at.button if b.key == "tpk_cancel"]
    assert not next(b for b in at.button if "Cook" in b.label).disabled  # the kitchen takes the next order


def test_an_order_measured_on_a_shared_stove_says_so_under_its_panels():
    at = open_kitchen()
    at.toggle(key="tpk_live").set_value(True).run()
    at.slider(key="tpk_new").set_value(4)
    at.run()
    cook(at)
    job = at.session_state["tpk_job"]
    assert job.wait(WAIT_S) and job.status == "done", job.error
    at.run()
    assert bool([w for w in at.warning if "stove was shared" in w.value]) == bool(job.shared_cores)  # as measured
    job.shared_cores = "something else used the engine's cores for 0.4 s of this order's 1.0 s (40%: ...)"
    at.run()  # the page draws what the worker recorded on the job
    shared = [w.value for w in at.warning if "stove was shared" in w.value]
    assert len(shared) == 1 and "0.4 s of this order's 1.0 s" in shared[0] and "\n" not in shared[0]
