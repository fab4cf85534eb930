"""Lab 4, keep the soup warm: cache static vs growing vs none (lab/kv_cache.py)."""

import streamlit as st

from kitchen_viz.charts import kv_figures
from kitchen_viz.lab_page_kit import Experiment, Prediction, render_experiment
from lab.kv_cache import MODES, KvSettings, run_kv_cache

EXPERIMENT = Experiment(
    key="kv_cache",
    title="🔥 Keep the soup warm: the KV cache",
    kitchen="The wok's finished dish slides onto the warm serving counter and the soup pot ladles from it. "
    "Without the counter, every spoonful means cooking the whole meal again, so each ladle is slower than "
    "the last. A counter that is rebuilt bigger for every spoonful works, but keeps moving the meal.",
    engineering="`static` preallocates K/V for the whole order (prompt + new tokens) and writes one column "
    "per step; `growing` "
    "concatenates (copies the cache every step); `none` recomputes the whole sequence every step. Same "
    "tokens, very different per-step latency.",
    predict=Prediction(
        question="Without a cache, how many times slower is a late decode step than an early one?",
        unit="x",
        min_value=0.1,
        max_value=1000.0,
        step=0.5,
        answer=lambda r: r.run("none").growth_ratio if "none" in [x.mode for x in r.runs] else float("nan"),
    ),
    run=run_kv_cache,
    figures=kv_figures,
    tables=lambda r: {"steps": r.to_frame()},
)


def settings_form(info) -> KvSettings:
    prompt_len = st.slider("Prompt length (tokens)", 4, 64, 16, key="kv-prompt")
    most = max(16, min(1024, info.max_context - prompt_len))
    new_tokens = st.slider("Decode steps", 16, most, min(256, most), key="kv-new")
    modes = st.multiselect("Cache modes", MODES, default=list(MODES), key="kv-modes")
    return KvSettings(prompt_len=prompt_len, new_tokens=new_tokens, modes=tuple(modes) or MODES)


render_experiment(EXPERIMENT, settings_form)
