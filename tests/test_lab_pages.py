"""AppTest renders every lab page and the dashboard on the real chef, through the app's kitchen.

Checked: each page frames the experiment, asks for a prediction before anything else, and only then
offers Run; a run goes through the session's kitchen (its kitchen host) and shows charts, a table and the
inspector's verdict; a second visitor sees the stored result at once (after guessing) with Re-run.
"""

import re
from pathlib import Path

import pytest
import torch
from app_kit import lab_page_test
from streamlit.testing.v1 import AppTest

from lab.experiment import default_settings
from lab.registry import DASHBOARD, EXPERIMENTS, experiment

REPO = Path(__file__).resolve().parents[1]
PAGES = {e.key: f"{e.key}-guess" for e in EXPERIMENTS}  # experiment -> its prediction's widget key


@pytest.fixture(autouse=True)
def quiet_lab(tmp_path, monkeypatch):
    """Results go to a fresh cache folder; torch single-threaded (see test_lab_compute)."""
    monkeypatch.setenv("TWO_POT_LAB_CACHE", str(tmp_path / "lab-cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def page(key: str) -> AppTest:
    """One experiment's page as the app builds it from the registry (kitchen_viz/lab_page_kit.py)."""
    return lab_page_test(key, 180)


def run_buttons(at: AppTest) -> list:
    return [b for b in at.button if b.label in ("Run", "Re-run")]


def test_every_experiment_gets_its_page_from_the_registry_with_no_page_file():
    assert len({e.key for e in EXPERIMENTS}) == len(EXPERIMENTS) >= 7
    assert [e.url_path for e in EXPERIMENTS] == [f"lab_{k}" for k in PAGES]
    assert not list((REPO / "kitchen_viz" / "web" / "pages").glob("lab_*.py"))  # one module and one registry line, nothing else
    assert (REPO / "kitchen_viz" / "web" / DASHBOARD.path).is_file()
    with pytest.raises(KeyError, match="no lab experiment 'cold_soup' \\(known: banquet, tables"):
        experiment("cold_soup")


EMOJI = re.compile("[\U0001F000-\U0001FFFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F\u200D]")


def test_every_lab_icon_is_a_material_icon_streamlit_knows_and_no_title_needs_an_emoji_font():
    """A classroom Linux box has no emoji font: an emoji icon is an empty box there. Streamlit's own
    Material Symbols font ships with the app, and `st.Page` refuses a name it does not know."""
    from streamlit.material_icon_names import ALL_MATERIAL_ICONS

    for icon in [e.icon for e in EXPERIMENTS] + [DASHBOARD.icon]:
        name = re.fullmatch(r":material/([a-z0-9_]+):", icon)
        assert name and name.group(1) in ALL_MATERIAL_ICONS, icon
    for e in EXPERIMENTS:
        for text in (e.title, e.nav_title, e.story.element, e.story.link_label, e.kitchen, e.engineering):
            assert not EMOJI.search(text), f"{e.key}: {text!r} needs an emoji font"
        for name in re.findall(r":material/([a-z0-9_]+):", e.story.element):
            assert name in ALL_MATERIAL_ICONS, (e.key, name)


def test_every_form_gives_its_experiment_settings_without_a_widget_touched():
    from engine import Engine

    info = Engine.load("chef").info
    for e in EXPERIMENTS:
        settings = default_settings(e, info)
        assert type(settings) is type(e.record(info)), e.key


@pytest.mark.parametrize("key", list(PAGES))
def test_page_asks_for_a_prediction_before_offering_run(key):
    at = page(key).run()
    assert not at.exception, at.exception
    exp = experiment(key)
    assert at.title[0].value == f"{exp.icon} {exp.title}"
    assert "In the kitchen" in " ".join(m.value for m in at.markdown)
    assert at.number_input(key=PAGES[key]).value is None
    assert run_buttons(at) == []
    at.number_input(key=PAGES[key]).set_value(2.0).run()
    assert not at.exception, at.exception
    assert [b.label for b in run_buttons(at)] == ["Run"]


def test_run_shows_charts_table_verdict_and_is_stored_for_the_next_visitor():
    at = page("padding").run()
    at.number_input(key="padding-guess").set_value(40.0).run()
    run_buttons(at)[0].click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    text = " ".join(m.value for m in at.markdown)
    assert "You guessed **40%**" in text and "this machine measured" in text
    assert len(at.get("plotly_chart")) == 2
    assert len(at.dataframe) == 1 and set(at.dataframe[0].value["mode"]) == {"padded", "packed"}
    assert at.info and "the wok is the bottleneck" in at.info[0].value

    again = page("padding").run()
    assert not again.get("plotly_chart")  # hidden until this visitor guesses too
    again.number_input(key="padding-guess").set_value(10.0).run()
    assert [b.label for b in run_buttons(again)] == ["Re-run"]
    assert len(again.get("plotly_chart")) == 2
    assert any("stored measurement" in c.value for c in again.caption)


@pytest.mark.parametrize("key", ["dinner_rush", "stall", "leftovers"])
def test_serving_pages_run_on_the_kitchen_and_show_every_chart_table_and_their_verdict(key):
    """The serving labs' defaults run through the app's kitchen in seconds; every part is drawn."""
    exp = experiment(key)
    at = page(exp.key).run()
    at.number_input(key=f"{key}-guess").set_value(3.0).run()
    run_buttons(at)[0].click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert "You guessed **3" in " ".join(m.value for m in at.markdown)
    charts = at.get("plotly_chart")
    assert len(charts) == {"dinner_rush": 3, "stall": 2, "leftovers": 3}[key]
    assert (
        len(at.dataframe) == {"dinner_rush": 2, "stall": 2, "leftovers": 3}[key]
    )  # summary, rows (, memory)
    headline = at.info[0].value
    assert {"dinner_rush": "requests/s", "stall": "gap", "leftovers": "cold"}[key] in headline
    assert any(m.value.startswith("#### 4. The inspector's verdict (on the run: ") for m in at.markdown)


def test_dashboard_renders_empty_then_with_a_recorded_run():
    from engine import Engine
    from kitchen_viz.app_state import run_log

    at = AppTest.from_file(str(REPO / "kitchen_viz" / "web" / DASHBOARD.path), default_timeout=60).run()
    assert not at.exception, at.exception
    log = run_log()
    if len(log) == 0:
        assert any("No orders cooked yet" in i.value for i in at.info)
    eng = Engine.load("chef")
    log.record(
        model="chef", device="cpu", result=eng.generate(["ROMEO:"], max_new_tokens=6), queue_wait_s=0.01
    )
    at.run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == 6
    frame = log.frame()  # the dashboard counts the newest run's kind of kitchen (model, device, dtype)
    newest = frame.iloc[-1]
    same = (frame["model"] == newest["model"]) & (frame["device"] == newest["device"])
    same &= frame["dtype"] == newest["dtype"]
    assert at.metric[0].value == str(int(same.sum()))
