"""The app in Streamlit's AppTest, as the page tests open it: after the chef has loaded."""

from __future__ import annotations

import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")
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
