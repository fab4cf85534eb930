"""The Kitchen (home page): order, watch the two pots cook it live, read the measured numbers."""

import streamlit as st

from kitchen_viz.app_state import current_settings, service_for
from kitchen_viz.fetch_progress import fetch_state
from kitchen_viz.kitchen_ui import draw_live, draw_loading, release_cook, start_cook
from kitchen_viz.order_control import draw_cancel, order_caps
from kitchen_viz.order_form import order_ui
from kitchen_viz.outcome import draw_failed_order

settings = current_settings()
st.title(":material/skillet: The Two-Pot Kitchen")
INTRO = ("Order a prompt, press **Cook**, and watch the real engine: the **wok** (prefill) tosses every prompt "
         "token of every table in one pass; the **serving counter** holds the KV cache; the **soup pot** (decode) "
         "ladles one token per table per step. Every number below was measured a moment ago on this machine.")  # fmt: skip
# On a projector (presenter mode) the Cook row and the kitchen come first: their places are kept
# right under the title and filled after the order form below them has run, so the drawing is on
# the first screen and Cook beside it; the controls and the kitchen's details follow.
cook_slot, cancel_slot, kitchen_slot = (st.container(), st.container(), st.container()) if settings.presenter \
    else (None, None, None)  # fmt: skip
if kitchen_slot is None:
    st.caption(INTRO)

if fetch_state(settings.model) is not None:  # fetched on first use and not ready yet: no kitchen to open
    st.info("This model is being fetched for its first use; the sidebar shows how far along it is. "
            "The kitchen opens here by itself when it is ready.", icon=":material/downloading:")
    st.stop()
svc = service_for(settings)
if svc.state == "loading":
    draw_failed_order()
    draw_loading(svc)
    st.stop()
if svc.state == "error":  # another make of server (vLLM, llama.cpp) is not a failure: one line of what it cannot do
    if getattr(svc, "foreign", False):
        st.info(svc.load_error)
    else:
        st.error(f"Could not open this kitchen: {svc.load_error}")
    st.stop()

info = svc.info
if kitchen_slot is not None:
    st.caption(INTRO)
st.caption(
    f"Model **{info.name}** · {info.n_params / 1e6:,.1f} M parameters · {info.weight_bytes / 1e6:,.1f} MB of "
    f"weights on **{info.device}** ({info.precision}) · reads up to {info.max_context:,} tokens at once"
    f" · every pass runs **{info.decode_step or 'op by op'}**"
    + ("" if info.trained else " · random weights: the timing is real, the text is not")
)
with st.expander("Engineer's details", icon=":material/engineering:"):
    st.markdown(
        f"- context: {info.max_context:,} tokens (prompt + reply)\n"
        f"- KV cache: {info.kv_bytes_per_token:,} bytes per token\n"
        f"- engine threads: {svc.threads or 'default'}; the engine runs {svc.where}\n"
        f"- passes (prompts and decode steps): {info.decode_step or 'op by op'} (native: one C call a pass, "
        "built for this CPU's instruction set; op by op: torch runs the model's forward operation by operation)"
    )
st.caption(order_caps().summary())

order = order_ui(svc, settings.seed, cook_slot)
if cancel_slot is None:
    cancel_slot = st.container()  # always drawn, so the live view below keeps its place
if order is not None:
    start_cook(svc, order)
draw_cancel(cancel_slot)
with kitchen_slot if kitchen_slot is not None else st.container():
    draw_live(svc, settings.presenter, wok_capacity=info.max_context * 8)
release_cook()
