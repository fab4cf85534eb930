"""The lab's experiments, in the order the menu shows them: the one list everything else iterates.

Who reads `EXPERIMENTS`: `app.py` builds the Lab menu from it (one page per experiment at
`/lab_<key>`, drawn by `kitchen_viz.lab_page_kit`, plus `DASHBOARD`); the
Story's map links each experiment from its `story` element; `scripts/lab_record.py` records each
one; the tests render and check each one. No other list of experiments exists.

The order follows the two-pot story: the wok first (prefill), then the pot (decode), the roofline
that explains both, the serving counter (KV cache), the portioning station (per-step overhead), the
prep standard (padding), how the numbers are defined, then the serving night: many tables at once.

How to add an experiment (one module and one line here):

1. Write `lab/<name>.py`, read top-down: module docstring (what is measured, why, in kitchen and
   engine words), a frozen settings dataclass with defaults that finish in well under a minute
   on a 2-core CPU, a result dataclass with `to_frame()`, the compute function
   `run_<name>(engine, settings, on_progress=None)` (top level: it is pickled by name into the
   engine's process; refuse bad settings with a one-line `EngineError` naming the limit; report
   `lab.progress.ProgressTracker` steps), the figures function `(result, guess) -> [go.Figure]`
   drawn with `lab.plot_kit` (put the guess on the chart), and at the end:

        def settings_form(ui, info) -> PortionSettings:   # ui is the streamlit module on the page
            tables = ui.slider("Tables", 1, 16, 4, key="portions-tables")   # keys: "<key>-..."
            return PortionSettings(tables=tables)

        EXPERIMENT = Experiment(
            key="portions",                       # the page is pages/lab_portions.py
            title="Smaller portions: ...",         # the page's title (the icon goes before it)
            nav_title="Smaller portions: ...",     # the menu's
            icon=":material/compress:",            # Streamlit's Material icons: no emoji font needed
            kitchen="... in kitchen words ...",
            engineering="... in engine words ...",
            predict=Prediction("How many times ...?", "x", 0.1, 100.0, 0.5,
                               answer=lambda r: r.speedup),   # the measured value it asks about
            form=settings_form,
            run=run_portions,
            figures=portions_figures,
            record=lambda info: PortionSettings(),  # what scripts/lab_record.py records
            story=StoryLink(":material/compress: The element of the fable", "**The idea**: ...", "Lab: smaller portions"),
            # optional: tables=lambda r: {"steps": r.to_frame()}, verdict=..., verdict_on=...
        )

   `verdict(result, roof, dtype) -> lab.inspector.Verdict` defaults to the inspector on
   `result.sample` (one kept fixed-batch run, `lab.sample.Sample`); a serving experiment without
   one passes its own verdict from `lab/inspector.py` and `verdict_on` naming what it judged.
2. Import its `EXPERIMENT` below and add it to `EXPERIMENTS` where it belongs in the story.
3. Tests: the page tests and the recording pick it up by themselves; add its compute function's
   test on the chef (tests/test_lab_compute.py or a test file of its own) and its verdicts'
   tests (tests/test_inspector.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.apprentice import EXPERIMENT as APPRENTICE
from lab.banquet import EXPERIMENT as BANQUET
from lab.dinner_rush import EXPERIMENT as DINNER_RUSH
from lab.experiment import Experiment
from lab.kv_cache import EXPERIMENT as KV_CACHE
from lab.leftovers import EXPERIMENT as LEFTOVERS
from lab.metrics_defs import EXPERIMENT as METRICS
from lab.overhead import EXPERIMENT as OVERHEAD
from lab.padding import EXPERIMENT as PADDING
from lab.roofline_lab import EXPERIMENT as ROOFLINE
from lab.smaller_portions import EXPERIMENT as PORTIONS
from lab.stall import EXPERIMENT as STALL
from lab.tables import EXPERIMENT as TABLES
from lab.two_kitchens_lab import EXPERIMENT as TWO_KITCHENS
from serving.host import wire

EXPERIMENTS: list[Experiment] = [
    BANQUET,
    TABLES,
    ROOFLINE,
    KV_CACHE,
    OVERHEAD,
    PORTIONS,
    PADDING,
    METRICS,
    DINNER_RUSH,
    STALL,
    APPRENTICE,
    LEFTOVERS,
    TWO_KITCHENS,
]


def experiment(key: str) -> Experiment:
    """The experiment with this key; a one-line error naming the known keys otherwise."""
    for exp in EXPERIMENTS:
        if exp.key == key:
            return exp
    raise KeyError(f"no lab experiment '{key}' (known: {', '.join(e.key for e in EXPERIMENTS)})")


@dataclass(frozen=True)
class LabPage:
    path: str  # relative to the repository root, as st.Page expects
    title: str
    icon: str


DASHBOARD = LabPage("pages/dashboard.py", "Dashboard: all runs", ":material/dashboard:")  # a page file of its own


@dataclass(frozen=True)
class LabRun:
    """One experiment's run as a kitchen's job: `job = svc.submit(LabRun("padding", settings), ...)`.

    It lives beside the registry because its key names an experiment there. A host receives its
    `key` and `settings` and runs the experiment in its loop between orders (lab/sweeps.py).
    `keep(result)` runs wherever the result arrives, as soon as it does (the app stores it there, so
    a measurement survives the learner closing the tab mid-run); the job's result is what it returns.
    """

    key: str
    settings: Any
    keep: Callable[[Any], Any] | None = None


def _register_lab_types() -> None:
    """Every dataclass of the Lab, the engine and serving may cross a host's pipe and its HTTP routes
    (serving/host/wire.py): an experiment's settings, points and results, and the engine's, the
    bench's and the two kitchens' measurements they hold. The modules are those this registry has loaded."""
    for name, module in list(sys.modules.items()):
        if name.startswith(("lab.", "engine.", "serving.")) and module is not None:
            wire.register_module(module)


_register_lab_types()
