"""Lab 3, the roofline: prefill and decode steps under this machine's measured roofs (lab/roofline_lab.py)."""

import streamlit as st

from kitchen_viz.charts import roofline_figure
from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
from lab.roofline_lab import RooflineSettings, run_roofline


def decode_pct(result) -> float:
    decode = [p for p in result.points if p.phase == "decode"]
    return min(decode, key=lambda p: p.intensity).pct_of_roof


EXPERIMENT = Experiment(
    key="roofline",
    title="📈 The roofline: what limits each pot?",
    kitchen="Two limits rule any kitchen: how fast ingredients come through the pantry door (memory "
    "bandwidth) and how fast the cooks chop (compute). The wok chops a lot per armful fetched; the soup "
    "pot fetches the whole pantry for one spoonful.",
    engineering="We measure this machine's read bandwidth and matmul FLOP/s now, in the same run. Each step "
    "sits at its arithmetic intensity (analytic FLOPs / bytes); its height is the FLOP/s its forward pass "
    "achieved. The open circle above it on the roof is the theory for that step; the label is the % of roof "
    "achieved. Above 100 % means the weights fit in a cache faster than the measured memory roof.",
    predict=Prediction(
        question="What % of the roof will a batch-1 decode step reach?",
        unit="%",
        min_value=0.0,
        max_value=1000.0,
        step=5.0,
        answer=decode_pct,
    ),
    run=run_roofline,
    figures=lambda r, g: [roofline_figure(r, g)],
)


def settings_form(info) -> RooflineSettings:
    ctx = info.max_context - 1
    lens = tuple(n for n in (16, 64, 256, 1024) if n <= ctx)
    largest = st.select_slider("Largest decode batch", options=[1, 4, 16, 64], value=16, key="roofline-batch")
    quick = st.toggle("Quick roof measurement", value=True, key="roofline-quick")
    return RooflineSettings(
        prompt_lens=lens, batches=tuple(b for b in (1, 4, 16, 64) if b <= largest), quick=quick
    )


render_experiment(EXPERIMENT, settings_form)
