"""The order form's limits and messages: what a link, a control or a model
switch may do to an order, and what the page says about it.

Pure parts (`orders.reply_ceiling`, `prompt_ceiling`, `rounded_down`) are tested on a limits
function shaped like `Engine.limits`; the page's behaviour through AppTest on the real chef.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from app_kit import open_kitchen
from conftest import CHEF_CONTEXT
from streamlit.testing.v1 import AppTest

from kitchen_viz.orders import control_limits, prompt_ceiling, reply_ceiling, rounded_down

APP = str(Path(__file__).resolve().parent.parent / "kitchen_viz" / "web" / "app.py")


@dataclass(frozen=True)
class FakeLimits:
    max_batch: int
    max_context: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int


def llama_1b_like(prompt: int, new: int, budget: int = 2_000_000_000, per_token: int = 32_768) -> FakeLimits:
    """A 131,072-token context whose KV budget holds about 61,000 tokens of one table."""
    per_seq = (prompt + new) * per_token
    return FakeLimits(budget // per_seq, 131_072, budget, per_token, per_seq)


def test_the_prompt_control_stops_where_one_table_still_fits():
    cap, reason = prompt_ceiling(llama_1b_like, 131_072, 64)
    assert llama_1b_like(cap, 64).max_batch == 1 and llama_1b_like(cap + 1, 64).max_batch == 0
    assert cap < 131_008 and "KV budget" in reason  # not the context's 131,008: that could never cook


def test_the_reply_control_stops_where_one_table_still_fits():
    cap, reason = reply_ceiling(llama_1b_like, 131_072)
    assert llama_1b_like(1, cap).max_batch == 1 and llama_1b_like(1, cap + 1).max_batch == 0
    assert "KV budget" in reason


def test_where_the_context_decides_the_reason_says_so():
    roomy = lambda p, n: llama_1b_like(p, n, budget=10**15)  # noqa: E731
    assert prompt_ceiling(roomy, 512, 64) == (
        448,
        "the model's context is 512 tokens and 64 are kept for the reply",
    )
    assert reply_ceiling(roomy, 512)[0] == 511


def test_memory_would_allow_is_a_stable_rounded_figure():
    assert {rounded_down(n) for n in (19_331, 19_307, 19_051)} == {19_000}
    assert rounded_down(64) == 64 and rounded_down(987) == 980
    lim = control_limits(llama_1b_like(32, 64, budget=19_331 * 96 * 32_768), 32, 64)
    assert "about 19,000" in lim.batch_reason and "depends on" in lim.batch_reason


def test_a_link_with_batch_0_is_raised_to_1_and_says_why():
    at = open_kitchen(batch="0", temp="5")
    warnings = [w.value for w in at.warning]
    assert "?batch=0 raised to 1: an order needs at least one table." in warnings, warnings
    assert "?temp=5 lowered to 2: 2 is the highest offered." in warnings, warnings
    assert at.slider(key="tpk_batch").value == 1


def test_a_link_beyond_the_context_is_lowered_with_the_contexts_reason():
    at = open_kitchen(prompt="100000", new="64")
    warnings = [w.value for w in at.warning]
    assert any(w.startswith(f"?prompt=100000 lowered to {CHEF_CONTEXT - 64:,}: the model's context is {CHEF_CONTEXT:,}") for w in warnings), (
        warnings
    )


def test_the_order_and_the_model_are_kept_in_the_address():
    at = open_kitchen(prompt="40")
    assert at.query_params["prompt"] == "40" and at.query_params["model"] == "chef"


def test_the_live_view_choice_survives_a_model_switch():
    """Switching to a model that must load shows the loading page (no toggle drawn), and Streamlit
    drops the state of a widget it did not draw: the learner's choice must come back with the
    toggle (it came back off, every time)."""
    at = open_kitchen()
    at.toggle(key="tpk_live").set_value(True).run()
    # A kitchen no other test opens (the apprentice in float16), so it must load here whatever ran before.
    at.session_state["tpk_model"] = "apprentice"
    at.session_state["tpk_dtype"] = "float16"
    at.run()
    assert not [b for b in at.button if "Cook" in b.label]  # the loading page: no form, no toggle
    deadline = time.monotonic() + 120
    while not at.button and time.monotonic() < deadline:
        time.sleep(0.3)
        at.run()
    assert at.toggle(key="tpk_live").value is True


def test_a_refused_prompt_keeps_every_control_in_place():
    """Whitespace only is refused like an empty prompt; the batch control and a disabled Cook stay,
    so the layout does not jump while the learner fixes the prompt."""
    at = open_kitchen()
    at.radio(key="tpk_mode").set_value("Write a prompt").run()
    at.text_area(key="tpk_text").set_value(" \n\t  \n").run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("This order can't be cooked: the prompt is empty"), errors
    assert [b.disabled for b in at.button if "Cook" in b.label] == [True]
    assert at.slider(key="tpk_batch") is not None and at.toggle(key="tpk_live") is not None


def test_the_dashboard_takes_percentiles_over_one_kind_of_kitchen():
    """Two models in the log: the dashboard shows the newest run's model, device and precision
    only, and says so (it mixed every model and precision in one percentile)."""
    from engine import Engine
    from kitchen_viz.app_state import run_log
    from lab.registry import DASHBOARD

    log = run_log()
    chef = Engine.load("chef")
    result = chef.generate(["ROMEO:"], max_new_tokens=4)
    log.record(model="other", device="cpu", result=result, queue_wait_s=0.0)
    log.record(model="chef", device="cpu", result=result, queue_wait_s=0.0)
    # Opened after the records, so its filters start at this newest run (earlier tests' cooks are in
    # the shared log as well, and a page opened before would keep the filters it started with).
    at = AppTest.from_file(str(Path(APP).parent / DASHBOARD.path), default_timeout=60).run()
    assert not at.exception, at.exception
    frame = log.frame()  # earlier tests' cooks are in the shared log too: count what the filter keeps
    newest = frame.iloc[-1]
    chef_runs = int(((frame["model"] == "chef") & (frame["device"] == newest["device"])
                     & (frame["dtype"] == newest["dtype"])).sum())  # fmt: skip
    assert at.metric[0].value == str(chef_runs)
    assert any("model chef" in c.value and "precision float32" in c.value for c in at.caption)
    at.multiselect(key="dash-filter-model").set_value(["chef", "other"]).run()
    assert at.metric[0].value == str(chef_runs + 1)


def test_an_untouched_live_view_stays_as_shown_when_its_default_would_change(monkeypatch):
    """Under two-pot-kitchen the default comes from the feed module's state, which Streamlit resets
    when it reloads changed modules; the page keeps what the toggle last showed instead."""
    import kitchen_viz.order_form as ui

    monkeypatch.setattr(ui, "live_view_default", lambda: True)
    at = open_kitchen()
    assert at.toggle(key="tpk_live").value is True  # the default, untouched
    monkeypatch.setattr(ui, "live_view_default", lambda: False)
    at.session_state["tpk_dtype"] = "bfloat16"  # a kitchen that must load: the page without the toggle
    at.run()
    assert not [b for b in at.button if "Cook" in b.label]
    deadline = time.monotonic() + 120
    while not at.button and time.monotonic() < deadline:
        time.sleep(0.3)
        at.run()
    assert at.toggle(key="tpk_live").value is True


def test_the_batch_control_stops_at_the_instructors_cap_and_says_so():
    """The default caps allow 8,192 prompt tokens per order: 448-token prompts fit 18 tables. The
    control stops there (it offered 64, and Cook then refused)."""
    at = open_kitchen(prompt="448", new="64", batch="64")
    assert at.slider(key="tpk_batch").value == 18
    warnings = [w.value for w in at.warning]
    assert any(
        w.startswith("?batch=64 lowered to 18: the instructor's limit is 8,192 prompt tokens")
        for w in warnings
    ), warnings


def test_a_long_context_model_is_offered_what_its_kitchen_seats():
    """SmolLM2 reads 8,192 tokens, but a seat of the app's kitchen holds 4,097 (prompt and reply):
    the prompt control stops there, so it never offers an order the kitchen refuses, and its help
    says which limit decides."""
    at = open_kitchen()
    at.session_state["tpk_model"] = "preset:smollm2-135m"
    at.run()
    deadline = time.monotonic() + 180
    while not [b for b in at.button if "Cook" in b.label] and time.monotonic() < deadline:
        time.sleep(0.5)
        at.run()
    assert not at.exception, at.exception
    prompt = at.slider(key="tpk_prompt_len")
    new = at.slider(key="tpk_new").value
    assert prompt.max == 4097 - new and prompt.value == 32
    assert any("KV seat of this kitchen holds 4,097 tokens" in c.value for c in at.caption)


def test_a_refusal_reads_as_a_plain_sentence_without_its_status_code():
    from kitchen_viz.order_control import plain_line
    from kitchen_viz.outcome import failure_line

    line = "HTTP 400: prompt 1 is 12,399 tokens; the model's context is 512 tokens"
    assert plain_line(line) == "prompt 1 is 12,399 tokens; the model's context is 512 tokens"
    assert failure_line(line) == (
        "The kitchen could not cook this order: prompt 1 is 12,399 tokens; the model's context is 512 tokens."
    )


def test_the_kitchens_header_keeps_the_engineers_terms_in_their_own_expander():
    at = open_kitchen()
    words = " ".join(c.value for c in at.caption)
    for term in ("pid", "bytes per token", "http://", "engine threads"):
        assert term not in words, term
    details = next(e for e in at.expander if e.label == "Engineer's details")
    shown = " ".join(m.value for m in details.markdown)
    assert "bytes per token" in shown and "pid" in shown and "engine threads" in shown


def test_a_busy_machine_is_said_in_words_and_a_quiet_one_is_not():
    from kitchen_viz.order_control import busy_line

    assert busy_line(6.6, 2).startswith("This machine was busy while the order cooked: load 6.6 on 2 cores")
    assert busy_line(1.5, 2) == "" and busy_line(None, 2) == ""
