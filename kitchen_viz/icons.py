"""The app's icons: Streamlit's Material Symbols (shipped with Streamlit, drawn from its own font),
never an emoji, so a classroom machine without an emoji font shows an icon, not an empty box.

`nav_icon` keeps a page's own Material icon and gives any other (an emoji an experiment module
still names) the Lab's flask instead of a box.
"""

from __future__ import annotations

import re
from pathlib import Path

# The browser tab's icon: a file in the package, served by the app itself. (A Material icon as the
# tab's icon is fetched by Streamlit's page from a font CDN, so offline the tab showed none.)
FAVICON = str(Path(__file__).resolve().parent / "art" / "favicon.png")
KITCHEN = ":material/skillet:"
STORY = ":material/auto_stories:"
LESSONS = ":material/menu_book:"
CLASS_ORDER = ":material/receipt_long:"
THE_PASS = ":material/room_service:"
DASHBOARD = ":material/monitoring:"
LAB = ":material/science:"
WOK = ":material/local_fire_department:"
POT = ":material/soup_kitchen:"
COMPARE = ":material/compare_arrows:"
NEXT = ":material/arrow_forward:"
WARNING = ":material/warning:"
LOADING = ":material/hourglass_top:"
CANCEL = ":material/cancel:"

MATERIAL = re.compile(r"^:material/[a-z0-9_]+:$")
# Emoji code points (pictographs, dingbats, symbols, the emoji variation selector): what needs an emoji font.
EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\u2300-\u23ff\ufe0f\u200d]")


def nav_icon(icon: str | None) -> str:
    """A Material icon for the navigation: the page's own if it is one, else the Lab's flask."""
    return icon if icon and MATERIAL.match(icon) else LAB


def has_emoji(text: str) -> bool:
    return bool(EMOJI.search(text or ""))


def without_emoji(text: str) -> str:
    """`text` with its emoji taken out (an experiment's story element: "🥄 Smaller portions" -> "Smaller portions")."""
    return " ".join(EMOJI.sub("", text).split())
