"""The two-pot story (being written)."""

import streamlit as st

st.title("📖 The two-pot story")
