"""Lab 2, more tables: decode and prefill cost vs batch size (see lab/tables.py)."""

import streamlit as st

from kitchen_viz.charts import tables_figures
from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
from lab.tables import TablesSettings, run_tables

EXPERIMENT = Experiment(
    key="tables",
    title="🍽️ More tables: one ladle, many bowls",
    kitchen="The soup pot's slow part is lifting the ladle: reading the whole pot for every spoonful. "
    "Serving "
    "more tables from the same lift costs little extra, until each bowl needs real work of its own. The wok "
    "is already busy with a full pan, so more tables simply take proportionally longer.",
    engineering="A decode step reads every weight once, whatever the batch, and does 2 FLOPs per weight per "
    "sequence. At small batch it is memory-bound: the step time stays flat while tokens/s grows. Past the "
    "machine's ridge it turns compute-bound and rises. Prefill's time per token is flat from the start "
    "(the shape of Sarathi-Serve's figure 2, measured live).",
    predict=Prediction(
        question="At the largest batch, how many times longer does one decode step take than at batch 1?",
        unit="x",
        min_value=0.1,
        max_value=1000.0,
        step=0.5,
        answer=lambda r: r.points[-1].decode_step_s / r.points[0].decode_step_s,
    ),
    run=run_tables,
    figures=tables_figures,
)


def settings_form(info) -> TablesSettings:
    largest = st.select_slider(
        "Largest batch", options=[4, 8, 16, 32, 64, 128], value=64, key="tables-largest"
    )
    prompt_len = st.slider(
        "Prompt length (tokens)", 8, min(256, info.max_context // 2), 32, key="tables-prompt"
    )
    new_tokens = st.slider("New tokens per sequence", 4, 64, 16, key="tables-new")
    batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= largest)
    return TablesSettings(batches=batches, prompt_len=prompt_len, new_tokens=new_tokens)


render_experiment(EXPERIMENT, settings_form)
