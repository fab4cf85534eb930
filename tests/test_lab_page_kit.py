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
    """Stands in for a service Job here: only `finished` is read by InFlight."""

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


@dataclass(frozen=True)
class RefuseKnobs:
    prompt_len: int = 9999


def refuse_run(engine, settings, on_progress):
    """An experiment that refuses its settings, as a real one does for bad input. Top-level (not a
    closure): the lab runs sweeps in the engine's own process, which receives them pickled by name."""
    from engine.errors import EngineError

    raise EngineError(
        f"prompt {settings.prompt_len} tokens; the model's context is {engine.info.max_context}"
    )


def refusing_page():
    """A lab page whose experiment refuses its settings."""
    from test_lab_page_kit import RefuseKnobs, refuse_run

    from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
    from lab.experiment import StoryLink

    exp = Experiment(
        key="refuse",
        title="Refusal",
        nav_title="Refusal",
        icon="x",
        kitchen="k",
        engineering="e",
        predict=Prediction("Guess?", "x", 0.0, 10.0, 1.0, answer=lambda r: 0.0),
        form=lambda ui, info: RefuseKnobs(),
        run=refuse_run,
        figures=lambda r, g: [],
        record=lambda info: RefuseKnobs(),
        story=StoryLink("k", "e", "l"),
    )
    render_experiment(exp)


def test_refused_settings_show_one_error_line_and_no_results(tmp_path, monkeypatch):
    monkeypatch.setenv("TWO_POT_LAB_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        at = AppTest.from_function(refusing_page, default_timeout=120).run()
        at.number_input(key="refuse-guess").set_value(1.0).run()
        at.button(key="refuse-run").click().run()
    finally:
        torch.set_num_threads(threads)
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [f"prompt 9999 tokens; the model's context is {CHEF_CONTEXT}"]
    assert not at.get("plotly_chart") and not at.dataframe


def where_it_ran(engine, settings, on_progress):
    """A stand-in sweep: reports the process it ran in and what it could see of the engine."""
    import os

    on_progress(("ran in", os.getpid()))
    return settings, type(engine).__name__


def test_a_lab_sweep_runs_inside_the_engines_own_process():
    """CPU time and the profiler only see the engine's work in its process, so the sweep runs there."""
    from lab.experiment import run_in_engine
    from serving.service import KitchenService

    svc = KitchenService("chef", "cpu", "float32", threads=1)
    try:
        assert svc.wait_ready(120) and svc.state == "ready", svc.load_error
        job = svc.submit(
            lambda eng, emit: eng.run(run_in_engine, where_it_ran, {"n": 3}, emit=emit), "lab"
        )
        assert job.wait(120) and job.status == "done", job.error
        assert job.result == ({"n": 3}, "Engine")  # the real Engine, not the proxy
        assert job.events == [("ran in", svc.engine_pid)]
    finally:
        svc.close()
