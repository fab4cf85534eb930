"""The drawn kitchen: our SVG art plus a small script that replays the measured timeline.

Why a Streamlit Components v2 component (not `st.html` or an iframe): a v2 component stays mounted
between reruns and just receives new `data`, so the page's fragment can hand it fresh events four
times a second while its animation keeps one continuous clock. The script
(`kitchen_viz/art/scene.js`) draws the kitchen at engine time T = screen time / slowdown; this module
only registers it and passes `LiveRun.scene_data()` (plus, while cooking live, the panels'
numbers: the scene draws the live panels too, so each update touches one element, not two; and,
under `two-pot-kitchen`, the URL of the order's feed, which the script polls itself).

The art lives in `kitchen_viz/art/` (kitchen.svg, scene.css, scene.js), drawn for this project.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import streamlit as st

ART = Path(__file__).resolve().parent / "art"
COMPONENT_NAME = "two_pot_kitchen_scene"


@cache
def scene_sources() -> tuple[str, str]:
    """(css, js) of the scene; the SVG is inlined into the script as a string constant. The CSS
    includes the live panels' (live_panels.css), which the scene draws while an order cooks."""
    svg = (ART / "kitchen.svg").read_text()
    js = (ART / "scene.js").read_text().replace("__KITCHEN_SVG__", json.dumps(svg))
    css = (ART / "scene.css").read_text() + "\n" + (ART / "live_panels.css").read_text()
    return css, js


@cache
def _component():
    css, js = scene_sources()
    return st.components.v2.component(COMPONENT_NAME, css=css, js=js)


def draw_scene(data: dict | None, key: str = "kitchen-scene") -> str | None:
    """Mount (or update) the kitchen. `data` is `LiveRun.scene_data()`, or None for an idle kitchen;
    while an order cooks in the live view, `data["panels"]` (kitchen_viz.live_panels.live_panel_data)
    has the scene draw the two live panels above the kitchen, and `data["feed"]` ({"url"}: the
    order's event stream, kitchen_viz.live_feed) has it follow its updates itself.

    Returns what the scene said about its feed in the run it triggered: "done" once the fed order
    is finished, "failed: <why>" when it could not read the feed, None otherwise."""
    said = _component()(data=data, key=key, height="content", on_feed_change=lambda: None)
    return getattr(said, "feed", None)
