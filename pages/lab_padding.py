"""Lab 6, the prep standard: padded vs packed prefill of mixed-length prompts (lab/padding.py)."""

import streamlit as st

from kitchen_viz.charts import padding_figures
from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
from lab.padding import PaddingSettings, run_padding

EXPERIMENT = Experiment(
    key="padding",
    title="🧺 The prep standard: no idle wok",
    kitchen="To toss orders of 8 and 200 ingredients together, padding tops the small orders up with filler "
    "so every row is as long as the longest, and the wok heats the filler too. The supervisor's rule: no "
    "heat on an empty corner of the pan.",
    engineering="`padded` left-pads every prompt to the longest and masks the pads: B × max(L) slots. "
    "`packed` concatenates the prompts into one row with a block-diagonal causal mask: sum(L) slots, none "
    "wasted. Same first tokens either way.",
    predict=Prediction(
        question="What % of the padded wok's token slots are padding?",
        unit="%",
        min_value=0.0,
        max_value=100.0,
        step=5.0,
        answer=lambda r: r.point("padded").idle_share * 100,
    ),
    run=run_padding,
    figures=padding_figures,
)


def parse_lengths(text: str, limit: int) -> tuple[int, ...]:
    values = [int(v) for v in text.replace(" ", "").split(",") if v.isdigit()]
    return tuple(min(max(v, 1), limit) for v in values)


def settings_form(info) -> PaddingSettings:
    text = st.text_input(
        "Prompt lengths in the batch (comma-separated tokens)",
        "8, 16, 24, 40, 64, 96, 160, 256",
        key="padding-lengths",
    )
    lengths = parse_lengths(text, info.max_context - 1)
    if len(lengths) < 2:
        st.warning("Give at least two prompt lengths; using the default batch.")
        lengths = PaddingSettings().lengths
    repeats = st.slider("Repeats (median is kept)", 1, 5, 3, key="padding-repeats")
    return PaddingSettings(lengths=lengths, repeats=repeats)


render_experiment(EXPERIMENT, settings_form)
