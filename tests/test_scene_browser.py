"""The scene's script in a real browser, alone: what one update changes in the page.

The live view hands the scene an update twice a second while the engine cooks on the same
machine, so an update that brings nothing new must change nothing in the page (no attribute, no
text, no element: each change costs the browser style and layout work on the engine's cores;
docs/benchmarks/ui-overhead.md). Here the script (kitchen_viz/art/scene.js, as kitchen_viz/scene.py
serves it) is mounted in headless Chromium and fed a real chef order's timeline; a
MutationObserver counts what each update changed.
"""

from __future__ import annotations

import json

import pytest

from engine import Engine
from kitchen_viz.live_panels import live_panel_data
from kitchen_viz.panels import panel_values
from kitchen_viz.scene import scene_sources
from kitchen_viz.timeline import LiveRun
from tests.browser_kit import chromium, needs_chromium

pytestmark = [pytest.mark.browser, needs_chromium]

# The component's entry point becomes a global, so the page can call it as Streamlit would.
PAGE = """<!doctype html><html><head><style>{css}</style></head><body><div id="host"></div>
<script type="module">
{js}
window.tpkMutations = 0;
new MutationObserver((records) => {{ window.tpkMutations += records.length; }})
  .observe(document.getElementById("host"), {{subtree: true, childList: true, attributes: true, characterData: true}});
window.tpkUpdate = (data) => tpkScene({{data, parentElement: document.getElementById("host"), setTriggerValue: () => {{}}}});
window.tpkReady = true;
</script></body></html>"""


@pytest.fixture(scope="module")
def page():
    css, js = scene_sources()
    html = PAGE.format(css=css, js=js.replace("export default function", "const tpkScene = function", 1))
    with chromium() as browser:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_content(html)
        pg.wait_for_function("window.tpkReady === true")
        yield pg


def live_updates() -> list[dict]:
    """The scene's data at three moments of a real chef order, as the live view sends it:
    early (first events), later (more steps measured), and the later one again (nothing new)."""
    events = list(Engine.load("chef").stream(["ROMEO:", "JULIET: the night"], max_new_tokens=12, seed=0))
    out = []
    for cut in (4, len(events) - 3):
        run = LiveRun.for_order("order-1", [2, 5])
        run.consume(events[:cut])
        data = run.scene_data()
        data["t_done"] = None  # still cooking: the live view's still frames
        data["panels"] = live_panel_data(panel_values(run), None)
        data["feed"] = None
        out.append(json.loads(json.dumps(data)))
    return out


def changes(page, data: dict) -> int:
    page.evaluate("window.tpkMutations = 0")
    page.evaluate("(d) => window.tpkUpdate(d)", data)
    page.wait_for_timeout(100)  # let the observer deliver its records
    return page.evaluate("window.tpkMutations")


def test_an_update_with_nothing_new_changes_nothing_in_the_page(page):
    early, later = live_updates()
    assert changes(page, early) > 0  # mounts the kitchen and draws the first still frame
    assert changes(page, later) > 0  # new steps measured: bowls, panels and numbers move
    assert changes(page, later) == 0  # the same moment again: not one attribute or text rewritten
    assert changes(page, json.loads(json.dumps(later))) == 0  # an equal copy, as a new fetch brings it


def test_while_cooking_a_table_shows_its_latest_tokens_and_the_replay_all_of_them(page):
    """A still frame keeps each table's text to its latest 48 tokens (a paragraph of constant size
    at every update); once the order is done the replay's text is the whole answer."""
    events = list(Engine.load("chef").stream(["ROMEO:"], max_new_tokens=80, seed=0, temperature=0.0))
    run = LiveRun.for_order("order-long", [2])
    run.consume(events)
    done = json.loads(json.dumps(run.scene_data() | {"feed": None, "panels": None}))
    pieces = [piece for _, piece in done["tokens"][0]]
    live = done | {"run_id": "order-long-live", "t_done": None, "e2e": None}
    changes(page, live)
    shown = page.evaluate("document.querySelector('.tpk-text span').textContent")
    assert len(pieces) == 80 and shown == "…" + "".join(pieces[-48:])
    changes(page, done | {"run_id": "order-long-done", "slowdown": 1})  # the replay at engine speed: under a second
    page.wait_for_function(
        "(n) => document.querySelector('.tpk-text span').textContent.length === n", arg=len("".join(pieces)), timeout=20_000
    )
