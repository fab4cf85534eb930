"""What keeps the live view off the engine's core while an order cooks (docs/benchmarks/ui-overhead.md).

Each piece here was measured to take CPU from the engine during a live Cook on a 2-core machine:
Streamlit's full garbage collection after every fragment rerun, the page's own Cook rerun being
painted while the engine starts, and the stale fade Streamlit starts and cancels on a fragment's
elements at every tick.

Checked in a browser, where the behaviour is: the stale fade is off on the scene
(tests/test_browser.py::test_the_scene_is_not_faded_stale_while_its_fragment_reruns), the live
panels are drawn inside the scene, one element per update
(tests/test_browser.py::test_while_cooking_live_the_scene_draws_the_panels_then_the_page_draws_them),
and an update with nothing new changes nothing in the page (tests/test_scene_browser.py).
"""

from __future__ import annotations

import gc

import pytest
from streamlit.testing.v1 import AppTest

from serving.heap import freeze_heap
from serving.job import SETTLE_S


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # give the test process its ordinary collector back


def test_the_server_heap_is_frozen_so_later_full_collections_skip_it(unfrozen):
    kept = [[i] for i in range(10_000)]  # tracked objects alive at the Cook
    before = gc.get_freeze_count()
    freeze_heap()
    assert gc.get_freeze_count() >= before + len(kept)


def release_script(live: bool) -> None:
    """A page run that ends in `release_cook` with a finished stand-in job (nothing to wait for)."""
    import streamlit as st

    from kitchen_viz.kitchen_ui import K_LIVE, release_cook

    class Job:
        finished = True

        def release(self, settle_s: float = 0.0) -> None:
            st.session_state["released_after_s"] = settle_s

    st.session_state["tpk_job"] = Job()
    st.session_state[K_LIVE] = live
    release_cook()


@pytest.mark.parametrize("live", [True, False])
def test_both_views_let_the_browser_paint_the_cook_rerun_before_the_engine_starts(live):
    at = AppTest.from_function(release_script, args=(live,)).run()
    assert not at.exception
    assert at.session_state["released_after_s"] == SETTLE_S


def test_a_run_knows_its_tables_before_the_engine_starts():
    """The scene draws tickets and tables in the Cook rerun, before the measured cook."""
    from engine.events import PrefillStart
    from kitchen_viz.timeline import LiveRun

    early = LiveRun.for_order("a", [25, 25])
    data = early.scene_data()
    assert data["batch"] == data["shown_tables"] == 2 and data["prompt_tokens"] == [25, 25]
    assert data["prefill"] is None and data["steps"] == [] and data["tokens"] == [[], []]
    start = PrefillStart(t=0.001, batch=2, prompt_tokens=[25, 25], slots=50, mode="padded")
    late = LiveRun("a")
    early.consume([start])
    late.consume([start])
    assert early.scene_data() == late.scene_data()
