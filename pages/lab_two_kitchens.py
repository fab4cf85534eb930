"""A lab page: the experiment this file's name names (pages/lab_<key>.py; see lab/registry.py)."""

from kitchen_viz.lab_page_kit import render_page

render_page(__file__)
