"""The app in Streamlit's AppTest, as the page tests open it: after the chef has loaded."""

from __future__ import annotations

import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "kitchen_viz" / "web" / "app.py")
WAIT_S = 120  # the first runs show the loading line until the engine process is up


def open_kitchen(state: dict | None = None, **query) -> AppTest:
    """The Kitchen with `query` as its link's parameters (and `state` in its session, e.g. the
    sidebar's choices), once its Cook button is drawn."""
    at = AppTest.from_file(APP, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    for k, v in (state or {}).items():
        at.session_state[k] = v
    at.run()
    deadline = time.monotonic() + WAIT_S
    while not any("Cook" in b.label for b in at.button) and time.monotonic() < deadline:
        assert not at.exception, at.exception
        time.sleep(0.3)
        at.run()
    assert not at.exception, at.exception
    return at


def lab_page_test(key: str, timeout: float = 300) -> AppTest:
    """One lab experiment's page, drawn as the app's navigation draws it (from the registry: no
    page file exists per experiment)."""
    script = f"from kitchen_viz.lab_page_kit import render_experiment\nfrom lab.registry import experiment\n" \
             f"render_experiment(experiment({key!r}))\n"  # fmt: skip
    return AppTest.from_string(script, default_timeout=timeout)
