"""Two-Pot Kitchen: the entry point. Navigation, the shared controls, presenter mode.

Run it with `two-pot-kitchen` (or `streamlit run app.py`). Every page reads the sidebar's shared
controls through `kitchen_viz.app_state.current_settings()`; the pages themselves live in `pages/`.
The Kitchen is the home page; the Story tells the fable; the Lab section is built from
`lab.registry` (one page per experiment, kitchen_viz/lab_page_kit.py), so a new experiment needs
no page file and no edit here.
"""

from __future__ import annotations

import streamlit as st

from kitchen_viz import app_state, fetch_progress, icons, model_pick
from kitchen_viz.app_state import (
    KEY_DEVICE,
    KEY_DTYPE,
    KEY_MODEL,
    KEY_PRESENTER,
    KEY_SEED,
    PRECISION_LABELS,
    PRECISIONS,
    device_choices,
    safe_model_choices,
)
from kitchen_viz.lab_page_kit import lab_page
from kitchen_viz.style import page_css, presenter_css
from lab.registry import DASHBOARD, EXPERIMENTS
from serving.app_settings import AppSettings

# Presenter mode opens with the sidebar closed: at 1024 px the kitchen's drawing needs the width.
_presenter = st.session_state.get(KEY_PRESENTER, AppSettings.current().presenter or (
    st.query_params.get("presenter", "0") not in ("0", "false", "no")))  # fmt: skip
st.set_page_config(page_title="Two-Pot Kitchen", page_icon=icons.KITCHEN, layout="wide",
                   initial_sidebar_state="collapsed" if _presenter else "auto")  # fmt: skip


def navigation_ui():
    """Kitchen (home), Story, the class kitchen, then the lab: the registry's experiments in its
    order, and the dashboard."""
    sections = {
        "Kitchen": [
            st.Page("pages/kitchen.py", title="Kitchen", icon=icons.KITCHEN, default=True),
            st.Page("pages/story.py", title="The two-pot story", icon=icons.STORY),
        ]
        + (
            [st.Page("pages/lessons.py", title="Suggested orders", icon=icons.LESSONS)]
            if (app_state.APP_DIR / "pages/lessons.py").is_file()
            else []
        )
    }
    sections["Class kitchen"] = [
        st.Page("pages/class_order.py", title="Order from a class kitchen", icon=icons.CLASS_ORDER),
        st.Page("pages/the_pass.py", title="The pass (instructor)", icon=icons.THE_PASS),
    ]
    sections["Lab"] = [lab_page(e) for e in EXPERIMENTS] + [
        st.Page(DASHBOARD.path, title=DASHBOARD.title, icon=icons.DASHBOARD)
    ]
    return st.navigation(sections)


def shared_controls_ui(url_path: str) -> None:
    """Model, device, dtype, seed and presenter mode: one set for every page of this session. The
    page at `url_path` (or a lesson's link) may pick the model first (kitchen_viz/model_pick.py)."""
    found, problem = safe_model_choices()
    choices = {c.name: c for c in found}
    model_pick.pick_for_page(url_path, list(choices))
    ignored = app_state.seed_from_url(list(choices))  # ?model= and ?presenter= (a reload keeps them)
    with st.sidebar:
        if problem:
            st.error(f"Model catalog: {problem}. Only the embedded chef is offered.")
        if ignored:
            st.warning(ignored)
        st.markdown(f"### {icons.KITCHEN} Two-Pot Kitchen")
        st.selectbox(
            "Model (from the catalog)",
            list(choices),
            format_func=lambda name: choices[name].label,
            key=KEY_MODEL,
            help="Only catalog models can be picked here; an instructor adds more with --catalog.",
        )
        chosen = choices[st.session_state[KEY_MODEL]]
        if fetch_progress.fetch_state(chosen.name) is not None:  # fetched on first use and not ready yet
            fetch_progress.fetch_progress_ui(chosen.name)
        if not chosen.trained:
            st.caption(":material/warning: Random weights: timing is real, text is not.")
        st.selectbox("Device", device_choices(), key=KEY_DEVICE)
        st.selectbox(
            "Precision",
            PRECISIONS,
            format_func=lambda p: PRECISION_LABELS.get(p, p),
            key=KEY_DTYPE,
            help="Weights and KV cache are stored in this dtype. int8: the weight matrices as int8 with a "
            "scale per output channel (a quarter of the bytes a decode step reads), float32 for the rest.",
        )
        st.number_input("Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key=KEY_SEED)
        st.toggle(
            "Presenter mode (large type)",
            value=AppSettings.current().presenter,  # `two-pot-kitchen --presenter`
            key=KEY_PRESENTER,
        )
    app_state.keep_model_in_url()


page = navigation_ui()
shared_controls_ui(page.url_path)
st.html(page_css())
if st.session_state.get(KEY_PRESENTER):
    st.html(presenter_css())
page.run()
