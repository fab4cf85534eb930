"""The whole class beside your order: the same section on the class order page and on the Kitchen.

Both pages order from a class kitchen, so both can show what the board (serving/http/board.py)
says about the steps that cooked the order: your TTFT and TPOT beside the kitchen's medians over
its last minute, how many of your steps the pot shared with someone else's order, the pot's batch
size at every step while yours cooked (tickets joining mid-service marked), and the rail now.
"""

from __future__ import annotations

import streamlit as st

from kitchen_viz.class_rail import batch_figure, rail_html, you_and_kitchen, your_steps
from lab.units import fmt_s


def draw_whole_class(board: dict, ttft_s: float | None, tpot_s: float | None, measured: str,
                     rail: bool = False, presenter: bool = False) -> None:  # fmt: skip
    """`measured`: where your own numbers were measured ("client" or "kitchen"); `rail`: also draw
    the tickets in the kitchen now (the order page keeps its own rail above)."""
    st.subheader("The whole class")
    yk = you_and_kitchen(ttft_s, tpot_s, board)
    c = st.columns(4)
    c[0].metric("Your TTFT", fmt_s(yk.your_ttft_s))
    c[1].metric("Kitchen's TTFT", fmt_s(yk.kitchen_ttft_s))
    c[2].metric("Your TPOT", fmt_s(yk.your_tpot_s))
    c[3].metric("Kitchen's TPOT", fmt_s(yk.kitchen_tpot_s))
    st.caption(f"Yours measured {'at the client' if measured == 'client' else 'by the kitchen'}; the kitchen's "
               f"are its medians over the {yk.kitchen_finished} requests it finished in the last minute (yours "
               f"included), measured by the kitchen. {yk.shared_steps} of the {yk.your_steps} steps that cooked "
               "your order also cooked someone else's.")  # fmt: skip
    steps = your_steps(board)
    if steps:
        st.plotly_chart(batch_figure(steps, presenter), use_container_width=True)
    if rail:
        st.caption("The rail now: every order in the class kitchen (yours highlighted, the others anonymous).")
        st.markdown(rail_html(board), unsafe_allow_html=True)
