"""Suggested orders: the lesson plan, each order one click from the Kitchen, printable."""

import streamlit as st

from kitchen_viz.lessons import LESSONS, model_words, order_words, plan_markdown, query

# Printing the page (Ctrl+P) keeps the plan and drops the app's chrome.
st.html(
    """<style>@media print {
  [data-testid="stSidebar"], [data-testid="stHeader"], [data-testid="stToolbar"], [class*="st-key-lessons-tools"] { display: none !important; }
  [data-testid="stMainBlockContainer"] { padding: 0 !important; max-width: none !important; }
}</style>"""
)
st.title(":material/menu_book: Suggested orders: a lesson plan")
st.markdown(
    f"{len(LESSONS)} orders, each showing one lesson. Press **Cook this order** (it opens the Kitchen with "
    "the order set), cook, then look where the lesson says. Some lessons ask for a second order: cook it "
    "too, then open **Compare two orders** under the kitchen to see both side by side. Every number on "
    "screen is measured on this machine; this plan names none and predicts none."
)
with st.container(horizontal=True, key="lessons-tools"):
    st.download_button(
        "Download the plan (Markdown, printable)",
        data=plan_markdown(),
        file_name="two-pot-kitchen-lessons.md",
        mime="text/markdown",
        on_click="ignore",
    )
    st.caption("Or print this page (Ctrl+P): the sidebar and buttons are left out.")

for i, lesson in enumerate(LESSONS, start=1):
    with st.container(border=True):
        st.markdown(f"### {i}. {lesson.title}")
        st.markdown(f"**Order:** {order_words(lesson.order)}")
        st.markdown(f"**Model:** {model_words(lesson)}")
        st.markdown(f"**Look at:** {lesson.look_at}")
        st.markdown(f"**Ask the class:** {lesson.ask}")
        with st.container(horizontal=True, key=f"lessons-tools-{i}"):
            st.page_link(
                "pages/kitchen.py", label="Cook this order", icon=":material/local_fire_department:", query_params=query(lesson.order, i, lesson.model)
            )
            if lesson.compare_with:
                st.page_link(
                    "pages/kitchen.py",
                    label=f"Then: {order_words(lesson.compare_with)} (as many tables as the order above was served)",
                    icon=":material/compare_arrows:",
                    query_params=query(lesson.compare_with, 100 + i, lesson.model),
                )
