"""The experiment page's shared machinery: joining a run in flight, and refusals shown as one line."""

import threading
import time
from dataclasses import dataclass

import torch
from conftest import CHEF_CONTEXT
from streamlit.testing.v1 import AppTest

from lab.inflight import InFlight


@dataclass
class FakeJob:
    """Stands in for a kitchen's Job here: only `finished` is read by InFlight."""

    finished: bool = False


def test_second_visitor_joins_the_run_in_flight_and_a_finished_run_is_not_joined():
    inflight, submitted = InFlight(), []

    def submit():
        submitted.append(FakeJob())
        return submitted[-1]

    first, joined_first = inflight.join_or_submit("k", submit)
    second, joined_second = inflight.join_or_submit("k", submit)
    assert (joined_first, joined_second) == (False, True) and second is first and len(submitted) == 1
    assert inflight.running("k") is first and inflight.running("other") is None
    first.finished = True
    third, joined_third = inflight.join_or_submit("k", submit)
    assert not joined_third and third is not first and len(submitted) == 2


def test_concurrent_visitors_start_one_run():
    inflight, submitted = InFlight(), []

    def submit():
        time.sleep(0.01)  # widen the race window
        submitted.append(FakeJob())
        return submitted[-1]

    threads = [threading.Thread(target=inflight.join_or_submit, args=("k", submit)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(submitted) == 1


def refusing_page():
    """A lab page whose settings its experiment refuses, as it does for bad input: the prep
    standard (lab/padding.py) with one prompt longer than the model's context."""
    from dataclasses import replace

    from kitchen_viz.lab_page_kit import render_experiment
    from lab.padding import PaddingSettings
    from lab.registry import experiment

    render_experiment(replace(experiment("padding"), form=lambda ui, info: PaddingSettings(lengths=(8, 9999), repeats=1)))


def test_refused_settings_show_one_error_line_and_no_results(tmp_path, monkeypatch):
    monkeypatch.setenv("TWO_POT_LAB_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        at = AppTest.from_function(refusing_page, default_timeout=120).run()
        at.number_input(key="padding-guess").set_value(1.0).run()
        at.button(key="padding-run").click().run()
    finally:
        torch.set_num_threads(threads)
    assert not at.exception, at.exception
    line = f"prep standard: prompt 9999 + 1 new tokens = 10000 tokens; the model's context is {CHEF_CONTEXT}"
    assert [e.value for e in at.error] == [line]
    assert not at.get("plotly_chart") and not at.dataframe
