"""The sidebar's progress bar for a model fetched on first use (the assistant): drawn while the fetch
runs, so choosing the model before it is ready neither blocks the page nor fails.

The fetch itself runs in a process of its own (engine/model_store.py `fetch_in_background`: the
launcher starts it at the first launch; choosing the model starts it if nothing did), and every
process can read its latest report from the model cache (`model_store.status`). The bar is a
fragment that rereads it each second; when the model is ready the whole app reruns once.
"""

from __future__ import annotations

import streamlit as st

from engine import model_store
from engine.errors import EngineError
from engine.model_store import FetchProgress
from serving.catalog import load_catalog


def fetch_state(model: str) -> FetchProgress | None:
    """None when the catalog model `model` needs no fetch (not a fetched entry, or already cached);
    else the fetch's latest report. Starts a background fetch when none is running and the last
    one did not fail (a failure waits for the teacher's "Fetch again")."""
    try:
        entry = load_catalog().get(model)
    except EngineError:
        return None
    if entry.kind != "fetch" or model_store.cached(entry.source) is not None:
        return None
    report = model_store.status(entry.source)
    if (report is None or report.stage != "failed") and not model_store.fetching(entry.source):
        model_store.fetch_in_background(entry.source)
    return report or FetchProgress(entry.source, "download")


@st.fragment(run_every=1.0)
def fetch_progress_ui(model: str) -> None:
    report = fetch_state(model)
    if report is None or report.stage == "ready":
        st.rerun()  # the whole app, once: the pages now open the model
    if report.stage == "failed":
        st.error(report.error, icon=":material/cloud_off:")
        if st.button("Fetch again", key="tpk_fetch_again"):
            model_store.fetch_in_background(load_catalog().get(model).source)
        return
    st.progress(report.fraction, text=f"{report.line} (the first time only)")
