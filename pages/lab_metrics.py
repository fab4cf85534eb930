"""Lab 7, metrics defined: one stream under every definition in use (lab/metrics_defs.py)."""

import streamlit as st

from kitchen_viz.charts import metrics_figures
from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
from lab.metrics_defs import MetricsSettings, run_metrics

EXPERIMENT = Experiment(
    key="metrics",
    title="📏 Metrics, defined: who holds the stopwatch?",
    kitchen="“How fast is the soup?” depends on who times it. One inspector starts at the first bowl, "
    "another when the guest sat down, a third divides the whole dinner by the number of bowls. Same dinner, "
    "different numbers, none of them wrong.",
    engineering="One recorded token stream, reported as vLLM's TPOT, per-token ITL (mean, p50, p99), "
    "llmperf's ITL (which counts TTFT as the first gap), and tokens/s with and without prefill. The spread "
    "is purely definitional: it is the same run.",
    predict=Prediction(
        question="How many times larger is an llmperf-style ITL than vLLM's TPOT for this stream?",
        unit="x",
        min_value=0.1,
        max_value=1000.0,
        step=0.1,
        answer=lambda r: r.value("ITL incl. TTFT") / r.value("TPOT"),
    ),
    run=run_metrics,
    figures=metrics_figures,
    tables=lambda r: {"definitions": r.to_frame(), "stream": r.stream_frame()},
)


def settings_form(info) -> MetricsSettings:
    prompt_len = st.slider(
        "Prompt length (tokens)",
        8,
        max(8, min(1024, info.max_context // 2)),
        min(256, info.max_context // 2),
        key="metrics-prompt",
    )
    new_tokens = st.slider("New tokens", 8, 128, 32, key="metrics-new")
    batch = st.select_slider("Batch", options=[1, 2, 4, 8], value=1, key="metrics-batch")
    return MetricsSettings(prompt_len=prompt_len, new_tokens=new_tokens, batch=batch)


render_experiment(EXPERIMENT, settings_form)
