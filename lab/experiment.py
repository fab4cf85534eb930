"""What a lab experiment is: one object that holds everything its page, the Story and the recording need.

Why one object: an experiment used to be spread over a compute module, a page, a figures module,
the registry, the recording script's list, the tests' lists and the Story's map. Now each module in
`lab/` ends with one `EXPERIMENT = Experiment(...)` holding its settings form, compute function,
figures, prediction question, framing text and Story link; `lab/registry.py` lists them and every
other place iterates that list (how to add one: the registry's docstring).

No Streamlit here: `lab/` stays UI-free (it runs headless in the engine's process, in tests and in
`scripts/lab_record.py`). The settings form is written against a small `ui` object passed in by the
caller: the page passes the `streamlit` module itself, so `ui.slider(...)` *is* `st.slider(...)`;
`DefaultsUI` answers every widget with its default value, for headless callers (`default_settings`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from lab.inspector import Verdict, diagnose
from lab.model_for import CHEF, ModelFor


@dataclass(frozen=True)
class Prediction:
    """The "predict first" question: asked before any result is shown, then drawn on the chart."""

    question: str
    unit: str  # shown after the answer: "x", "%"
    min_value: float
    max_value: float
    step: float
    answer: Callable[[Any], float]  # the measured value the question asks about, from the result


@dataclass(frozen=True)
class StoryLink:
    """Where the experiment sits in the two-pot story (the Story page's map links it from there)."""

    element: str  # the kitchen element, as the Story names it ("🧾 Order tickets on the rail")
    meaning: str  # what it is in LLM inference (markdown)
    link_label: str  # the link's words ("Lab: more tables (batch size)")


def results_table(result) -> dict[str, pd.DataFrame]:
    """The default table: the result's own `to_frame()`, named "results"."""
    return {"results": result.to_frame()}


def sample_verdict(result, roof, dtype: str | None = None, *, focus: str | None = None) -> Verdict:
    """The default verdict: the inspector on the one real run the result keeps (`result.sample`)."""
    s = result.sample
    return diagnose(s.metrics, s.trace, roof, dtype=dtype, focus=focus)


def decode_verdict(result, roof, dtype: str | None = None) -> Verdict:
    """For lessons about the soup pot: the pot's diagnosis, even on a run where the wok was longer."""
    return sample_verdict(result, roof, dtype, focus="decode")


@dataclass(frozen=True)
class Experiment:
    """One lab experiment, complete. Fields are what the page shows, top to bottom.

    `form(ui, info) -> settings`: the settings widgets (`ui` is the streamlit module on the page),
    `info` the model's `ModelInfo` (limits come from its context).
    `run(engine, settings, on_progress) -> result`: top-level function (it is pickled by name to
    the engine's own process).
    `figures(result, guess) -> list[go.Figure]`; `tables(result) -> {name: DataFrame}`.
    `verdict(result, roof, dtype) -> lab.inspector.Verdict`; `verdict_on(result)` names the run it
    judged. `record(info) -> settings`: the settings `scripts/lab_record.py` records with.
    `model`: the model the experiment is for (lab/model_for.py); its page opens on it.
    """

    key: str  # the page's address lab_<key>, cache and widget prefix, recorded file names
    title: str  # the page's title
    nav_title: str  # the menu's shorter title
    icon: str
    kitchen: str  # framing in kitchen words (markdown)
    engineering: str  # framing in engineering words (markdown)
    predict: Prediction
    form: Callable[[Any, Any], Any]
    run: Callable
    figures: Callable
    record: Callable[[Any], Any]
    story: StoryLink
    tables: Callable[[Any], dict[str, pd.DataFrame]] = results_table
    verdict: Callable[..., Verdict] = sample_verdict
    verdict_on: Callable[[Any], str] = field(default=lambda r: r.sample.label)
    model: ModelFor = CHEF  # the pot-is-memory-bound experiments: ASSISTANT

    @property
    def url_path(self) -> str:
        """The page's address in the app (`/lab_padding`): the app builds each lab page from the
        registry (kitchen_viz/lab_page_kit.py `lab_page`), so no page file exists per experiment."""
        return f"lab_{self.key}"


class DefaultsUI:
    """A `ui` for headless callers: every widget returns its default, nothing is drawn.

    Mirrors the few Streamlit widgets the forms use, with the same argument order.
    """

    def slider(self, label, min_value=None, max_value=None, value=None, *args, **kwargs):
        return value if value is not None else min_value

    def select_slider(self, label, options=(), value=None, **kwargs):
        return value if value is not None else list(options)[0]

    def toggle(self, label, value=False, **kwargs):
        return value

    def multiselect(self, label, options=(), default=None, **kwargs):
        return list(default or [])

    def text_input(self, label, value="", **kwargs):
        return value

    def number_input(self, label, min_value=None, max_value=None, value=None, *args, **kwargs):
        return value if value is not None else min_value

    def warning(self, *args, **kwargs):
        return None

    def caption(self, *args, **kwargs):
        return None


def default_settings(exp: Experiment, info) -> Any:
    """The settings a visitor gets without touching a widget."""
    return exp.form(DefaultsUI(), info)
