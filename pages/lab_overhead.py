"""Lab 5, the portioning station: per-step overhead of decode (lab/overhead.py)."""

import streamlit as st

from kitchen_viz.charts import overhead_figure
from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
from lab.overhead import OverheadSettings, run_overhead

EXPERIMENT = Experiment(
    key="overhead",
    title="⏱️ The portioning station: per-step overhead",
    kitchen="Each ladle is quick, but between ladles the cook wipes the rim, fetches a bowl, reads the slip. "
    "With a small pot those chores can take longer than the ladling itself. The supervisor's portioning "
    "station does the chores once, ahead of time.",
    engineering="A decode step = one forward pass + sampling + bookkeeping. We split its wall time into the "
    "math (summed self time of the aten ops, from torch.profiler), glue inside the forward pass (Python, "
    "modules, allocation, dispatch) and work outside it. On a GPU we also replay the step as a CUDA graph.",
    predict=Prediction(
        question="What % of a decode step is the model's math?",
        unit="%",
        min_value=0.0,
        max_value=100.0,
        step=5.0,
        answer=lambda r: r.points[0].math_share * 100,
    ),
    run=run_overhead,
    figures=lambda r, g: [overhead_figure(r, g)],
)


def settings_form(info) -> OverheadSettings:
    batch = st.select_slider("Batch", options=[1, 2, 4, 8, 16], value=1, key="overhead-batch")
    new_tokens = st.slider("Decode steps", 8, 64, 32, key="overhead-new")
    return OverheadSettings(batch=batch, new_tokens=new_tokens)


render_experiment(EXPERIMENT, settings_form)
