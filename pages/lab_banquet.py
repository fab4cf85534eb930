"""Lab 1, the big banquet: TTFT vs prompt length (see lab/banquet.py for what is measured)."""

import streamlit as st

from kitchen_viz.charts import banquet_figures
from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
from lab.banquet import BanquetSettings, run_banquet

MAX_SWEEP = 2048  # longer prompts exist on big presets, but a class demo should finish in minutes

EXPERIMENT = Experiment(
    key="banquet",
    title="🍲 The big banquet: how long until the first dish?",
    kitchen="A birthday banquet puts a whole table's ingredients in one wok. Same wok, same heat: at first "
    "a fuller wok costs little extra, then every extra ingredient adds its own time, and mixing everything "
    "with everything else adds more. Time to the first dish (TTFT) is the wok's time.",
    engineering="Prefill runs all L prompt tokens through the model in one forward pass. Matmul work grows "
    "like L, attention's like L². We time prefill-only runs (one new token) for prompt lengths up to the "
    "model's context and mark where prefill tokens/s stops improving: the wok is saturated.",
    predict=Prediction(
        question="How many times longer will TTFT be at the longest prompt than at the shortest?",
        unit="x",
        min_value=1.0,
        max_value=10000.0,
        step=1.0,
        answer=lambda r: r.points[-1].ttft_s / r.points[0].ttft_s,
    ),
    run=run_banquet,
    figures=banquet_figures,
)


def settings_form(info) -> BanquetSettings:
    ctx = min(info.max_context - 1, MAX_SWEEP)
    options = sorted({n for n in (16, 32, 64, 128, 256, 512, 1024, 2048) if n <= ctx} | {ctx})
    longest = st.select_slider(
        "Longest prompt (tokens)", options=options, value=options[-1], key="banquet-longest"
    )
    repeats = st.slider("Repeats per length (median is kept)", 1, 5, 3, key="banquet-repeats")
    lengths = tuple(n for n in options if n <= longest)
    return BanquetSettings(lengths=lengths, repeats=repeats)


render_experiment(EXPERIMENT, settings_form)
