"""Icons without an emoji font: every icon and title the Kitchen's pages and the navigation draw is a
Material Symbol (Streamlit ships its font) or plain text, never an emoji a bare classroom machine
shows as an empty box."""

from __future__ import annotations

import ast
from pathlib import Path

from streamlit.testing.v1 import AppTest

from kitchen_viz.icons import EMOJI, FAVICON, has_emoji, nav_icon, without_emoji

REPO = Path(__file__).resolve().parent.parent
# The files whose strings reach the Kitchen, the Story, the lesson plan, the Dashboard and the navigation.
DRAWN = [
    "kitchen_viz/web/app.py",
    "kitchen_viz/web/pages/kitchen.py",
    "kitchen_viz/web/pages/dashboard.py",
    "kitchen_viz/web/pages/lessons.py",
    "kitchen_viz/web/pages/story.py",
    "kitchen_viz/web/pages/class_order.py",
    "kitchen_viz/web/pages/the_pass.py",
    *[f"kitchen_viz/{name}.py" for name in (
        "kitchen_ui", "order_form", "outcome", "panels", "timeline", "scene", "live_panels", "order_control",
        "orders", "compare", "class_rail", "whole_class", "style", "charts", "story", "lessons", "wok_win",
        "live_feed",
    )],
    "lab/units.py",
]  # fmt: skip


def strings_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_emoji_test_knows_an_emoji_from_a_material_icon():
    assert has_emoji("🍳 Kitchen") and has_emoji("⚖️") and has_emoji("🛎️")
    assert not has_emoji(":material/skillet: Kitchen · prefill — 12.3 ms × 4")
    assert nav_icon("🥄") == ":material/science:" and nav_icon(":material/speed:") == ":material/speed:"
    assert without_emoji("🥄 Smaller portions") == "Smaller portions"


def test_no_string_the_kitchen_pages_draw_depends_on_an_emoji():
    found = [(f, s[:40]) for f in DRAWN for s in strings_of(REPO / f) if has_emoji(s) and "EMOJI" not in s]
    assert not found, found
    for art in (p for p in (REPO / "kitchen_viz/art").iterdir() if p.suffix != ".png"):  # the drawing, its panels
        assert not EMOJI.search(art.read_text()), art.name


def test_every_page_in_the_navigation_and_the_tab_have_a_material_icon(monkeypatch):
    import streamlit

    seen, real_nav, real_config = [], streamlit.navigation, streamlit.set_page_config

    def navigation(pages, **kw):  # what app.py hands Streamlit, recorded on the way
        seen.extend(p for section in pages.values() for p in section)
        return real_nav(pages, **kw)

    def set_page_config(**kw):
        seen.append(kw.get("page_icon"))
        return real_config(**kw)

    monkeypatch.setattr(streamlit, "navigation", navigation)
    monkeypatch.setattr(streamlit, "set_page_config", set_page_config)
    at = AppTest.from_file(str(REPO / "kitchen_viz" / "web" / "app.py"), default_timeout=60).run()
    assert not at.exception
    icons = [p if isinstance(p, str) else p.icon for p in seen]
    assert len(icons) >= 6  # the tab, the Kitchen's pages, the class kitchen's, the Lab's
    assert icons[0] == FAVICON and Path(FAVICON).is_file()  # the tab's: a file the app serves, offline
    assert all(icon.startswith(":material/") for icon in icons[1:]), icons
    titles = [p.title for p in seen if not isinstance(p, str)]
    assert not [t for t in titles if has_emoji(t)], titles
