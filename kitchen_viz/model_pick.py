"""The model a page or a lesson is for: chosen for the learner, said in one line, never forced.

Two ways a page picks the model before the sidebar draws its model box (lab/model_for.py says
which model each is for, and why):
  * a lesson's link (`?lesson=N&model=assistant&prompt=...`, the lesson plan's "Cook this order")
    selects its model, once per lesson link, as the Kitchen applies its order;
  * a lab page, the first time this session opens it, selects its experiment's model, unless the
    link that opened the app named one (a shared `?model=` link wins).
After that the sidebar is the learner's: picking another model there stands, and the lab page says
in one line which model the experiment is for and why.
"""

from __future__ import annotations

import streamlit as st

from kitchen_viz.app_state import KEY_MODEL
from lab.model_for import ModelFor
from lab.registry import EXPERIMENTS

KEY_OPENED = "tpk_pages_opened"  # lab pages this session has opened: each picks its model once
KEY_LESSON = "tpk_model_lesson"  # the lesson link whose model was applied last


def page_model(url_path: str) -> ModelFor | None:
    """The model a lab page's experiment is for (`lab_roofline` -> the assistant); None elsewhere."""
    return next((e.model for e in EXPERIMENTS if e.url_path == url_path), None)


def pick_for_page(url_path: str, model_names: list[str]) -> None:
    """Call before the sidebar's model box exists (its value can only be set before then)."""
    ss, params = st.session_state, st.query_params
    first_run = not ss.get("tpk_url_seeded")  # the link that opened the app is still unread
    lesson = params.get("lesson")
    if lesson is not None and lesson != ss.get(KEY_LESSON) and params.get("model") in model_names:
        ss[KEY_LESSON] = lesson
        ss[KEY_MODEL] = params["model"]
        return
    wanted = page_model(url_path)
    opened = ss.setdefault(KEY_OPENED, [])
    if wanted is None or url_path in opened:
        return
    opened.append(url_path)
    if first_run and "model" in params:  # a shared link chose the model: it wins
        return
    if wanted.name in model_names:
        ss[KEY_MODEL] = wanted.name


def model_line(wanted: ModelFor, current: str, model_names: list[str]) -> str:
    """The lab page's one line on its model. Example: "Runs on the assistant by default: its weights
    are far bigger than the CPU's cache, ... Pick another model in the sidebar to compare."."""
    if current == wanted.name:
        return f"Runs on {wanted.label} by default: {wanted.why}. Pick another model in the sidebar to compare."
    if wanted.name not in model_names:
        return f"This experiment is for {wanted.label} ({wanted.why}), which this server's catalog does not offer."
    return f"This experiment is for {wanted.label} ({wanted.why}); it runs on {current} now, as picked in the sidebar."
