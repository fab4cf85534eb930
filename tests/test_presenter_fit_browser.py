"""The Kitchen on a projector, measured in Chromium at 1024, 1280 and 1920 px, presenter mode on and
off, after two real orders:

* the soup pot's rim never crosses its note ("mean of N decode steps"), and no note under a station
  touches that station's drawing;
* the order tickets on the rail never touch the three stations' headings;
* the Compare bars show each part's name whole or not at all (never "ot 118.6 ms"), and none of
  Compare's numbers is cut;
* at 1024 px in presenter mode the drawing starts on the first screen (768 px), before and after
  a Cook.

One server and one page per presenter setting; the window is resized through the widths.
"""

from __future__ import annotations

import pytest

from tests.browser_kit import chromium, needs_chromium
from tests.test_browser import COOK_TIMEOUT_MS, server  # noqa: F401

WIDTHS = (1024, 1280, 1920)
SCREEN_H = 768  # a projector's first screen at 1024 px wide
pytestmark = [pytest.mark.browser, needs_chromium]

# Boxes in the drawing (its shadow root pierced): the stations' headings, the tickets, the pot's
# rim and body and the note under it.
SCENE_BOXES = """() => {
  const host = [...document.querySelectorAll('.st-key-kitchen-scene *')].find((e) => e.shadowRoot);
  const root = host ? host.shadowRoot : document;
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const svg = root.querySelector('svg.tpk-svg');
  return {
    svg: box(svg),
    headings: [...root.querySelectorAll('.tpk-station')].map((e) => ({text: e.textContent, box: box(e)})),
    tickets: [...root.querySelectorAll('#tpk-rail .tpk-ticket')].map(box),
    rim: box(root.querySelector('#tpk-pot-rim')),
    pot: box(root.querySelector('#tpk-pot-body path')),
    note: {text: root.querySelector('#tpk-pot-note').textContent, box: box(root.querySelector('#tpk-pot-note'))},
  };
}"""

# Compare's bars: each part's name and the part's own box; Compare's metric values and whether cut.
COMPARE_BOXES = """() => {
  const exp = [...document.querySelectorAll('[data-testid="stExpander"]')].find((e) => e.innerText.includes('Compare two orders'));
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const names = [...exp.querySelectorAll('.tpk-tl-seg')].map((seg) => {
    const span = seg.querySelector('span');
    return {text: span.textContent, seg: box(seg), name: box(span)};
  }).filter((n) => n.text);
  const values = [...exp.querySelectorAll('[data-testid="stMetricValue"] > div')].map((e) => ({
    text: e.innerText, cut: e.scrollWidth > e.clientWidth + 1, box: box(e), page: document.documentElement.clientWidth}));
  return {names, values};
}"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def touches(a, b, gap: float = 2.0) -> bool:
    """True when boxes a and b overlap or come closer than `gap` px."""
    return a[0] - gap < b[2] and b[0] - gap < a[2] and a[1] - gap < b[3] and b[1] - gap < a[3]


def scene_problems(m: dict) -> list[str]:
    found = []
    if touches(m["note"]["box"], m["rim"], 0) or touches(m["note"]["box"], m["pot"], 0):
        found.append(f"the pot's note {m['note']['text']!r} crosses the pot")
    for h in m["headings"]:
        for t in m["tickets"]:
            if touches(h["box"], t):
                found.append(f"a ticket touches the heading {h['text']!r}")
                break
    return found


def compare_problems(m: dict) -> list[str]:
    found = []
    for n in m["names"]:
        seg, name = n["seg"], n["name"]
        shown = name[1] < seg[3] - 1  # on the part's first line (a name that does not fit wraps below it, hidden)
        if shown and (name[0] < seg[0] - 0.5 or name[2] > seg[2] + 0.5):
            found.append(f"Compare cuts {n['text']!r}")
    for v in m["values"]:
        if v["cut"] or v["box"][2] > v["page"] + 0.5:
            found.append(f"Compare's value {v['text']!r} is cut")
    return found


def cook(page) -> None:
    """Press Cook on the page as it stands and wait for the replay's last frame."""
    button = page.get_by_role("button", name="Cook")
    button.wait_for(timeout=COOK_TIMEOUT_MS)
    button.click()
    page.get_by_text("Diagnosis:", exact=False).first.wait_for(timeout=COOK_TIMEOUT_MS)
    page.locator("#tpk-phase").filter(has_text="Every table served").wait_for(timeout=60_000)


def open_lesson(page, number: int) -> None:
    """The lesson plan's link for lesson `number`, in this session (a link, not a new page load)."""
    page.get_by_role("link", name="Suggested orders (lesson plan)").click()
    page.get_by_role("link", name="Cook this order").nth(number - 1).click()
    page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)


def drawing_top(page) -> float:
    return page.evaluate(SCENE_BOXES)["svg"][1] + page.evaluate("() => window.scrollY")


@pytest.mark.parametrize("presenter", [False, True], ids=["plain", "presenter"])
def test_the_drawing_and_compare_keep_their_text_clear_at_projector_widths(server, browser, presenter):  # noqa: F811
    flag = "&presenter=1" if presenter else ""
    page = browser.new_page(viewport={"width": 1024, "height": SCREEN_H})
    try:
        page.goto(server + f"/?prompt=8&batch=2&new=120&temp=0&live=0{flag}")  # a long pot
        cook(page)
        open_lesson(page, 5)  # "One bowl only": no pot at all, so its bar is drawn short beside the first
        cook(page)
        page.get_by_text("Compare two orders").click()
        page.get_by_text("Both bars are drawn on the scale").wait_for(timeout=30_000)
        found = []
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": SCREEN_H})
            page.wait_for_timeout(800)  # the page lays itself out again
            found += [f"{width} px: {p}" for p in scene_problems(page.evaluate(SCENE_BOXES))]
            found += [f"{width} px: {p}" for p in compare_problems(page.evaluate(COMPARE_BOXES))]
        assert not found, found
    finally:
        page.close()


def test_at_1024_in_presenter_mode_the_kitchen_is_on_the_first_screen(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1024, "height": SCREEN_H})
    try:
        page.goto(server + "/?prompt=16&batch=2&new=8&temp=0&live=0&presenter=1")
        page.wait_for_function("() => getComputedStyle(document.documentElement).fontSize === '22px'")
        page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
        page.locator("svg.tpk-svg").wait_for(timeout=60_000)
        before = drawing_top(page)
        cook(page)
        after = drawing_top(page)
        # its top in the first screen's upper half, so most of the kitchen shows without scrolling
        assert before < SCREEN_H / 2 and after < SCREEN_H / 2, (before, after)
    finally:
        page.close()
