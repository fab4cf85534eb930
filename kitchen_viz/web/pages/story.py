"""The two-pot story: the fable in our words, then each kitchen element and what it means."""

import streamlit as st

from kitchen_viz.lab_page_kit import page_target
from kitchen_viz.story import MAPPINGS, STORY


def draw_story() -> None:
    st.title(":material/auto_stories: The two-pot story")
    st.caption("Why a language model answers in two very different phases, told as a kitchen.")
    for heading, text in STORY:
        st.subheader(heading)
        st.markdown(text)


def draw_mapping() -> None:
    st.divider()
    st.header("From the kitchen to the engine")
    st.markdown(
        "Each thing you see in the Kitchen stands for one part of LLM inference. "
        "Follow the link to the control or lab experiment that shows it measured on this machine."
    )
    for m in MAPPINGS:
        with st.container(border=True):
            left, right = st.columns([2, 5])
            left.markdown(f"**{m.kitchen}**")
            right.markdown(m.engineering)
            target = page_target(m.link)
            if target is not None:
                right.page_link(target, label=m.link_label, icon=":material/arrow_forward:")
            else:
                right.caption(f"({m.link_label}: not in this build)")


def draw_handbook() -> None:
    st.divider()
    st.header("The head cook's handbook")
    st.markdown(
        "- **The first bowl is slow** (high TTFT): the wok is the bottleneck. Look at prompt length, batch size "
        "and how well prefill uses the machine's arithmetic.\n"
        "- **The bowls come slowly after that** (high TPOT): the pot is the bottleneck. Look at per-step "
        "overhead, how many bytes each step reads (weights + KV cache), CUDA graphs, or speculative decoding.\n"
        "- **Watch both panels.** Tuning only the wok and declaring victory leaves long answers slow."
    )


draw_story()
draw_mapping()
draw_handbook()
