"""A lesson a teacher can trust, in the browser, launched with the README's command (`two-pot-kitchen`):

* the same order cooked in two fresh sessions shows the same wok work (every prompt token cooked,
  TTFT within the noise) and leaves no leftovers; with "Reuse leftovers" on, the second cook says
  how many tokens it reused;
* one value per number: the drawing's last frame, the panels, the timeline and the diagnosis print
  the same TTFT, TPOT and tokens/s;
* presenter mode at 1024 px: TTFT, TPOT and tokens/s at least 40 px, the drawing's key figures at
  least 28 px and none of its text under 14 px, every chart's text at least 16 px;
* every chart on the Kitchen and the Dashboard, at 1024, 1280 and 1920 px, presenter off and on:
  no text over another text, none cut off at the chart's edge;
* with 64 tables the class's rail does not push the drawing down.

One server for the module, short orders; each page has its own deadline.
"""

from __future__ import annotations

import re

import pytest

from tests.browser_kit import chromium, needs_chromium
from tests.test_browser import COOK_TIMEOUT_MS, metric_value, server  # noqa: F401

WIDTHS = (1024, 1280, 1920)
pytestmark = [pytest.mark.browser, needs_chromium]

SCENE_TEXTS = """() => {
  const host = [...document.querySelectorAll('.st-key-kitchen-scene *')].find((e) => e.shadowRoot);
  const root = host ? host.shadowRoot : document;
  const svg = root.querySelector('svg.tpk-svg');
  const scale = svg.getBoundingClientRect().width / 1200;  // the drawing's units to screen px
  return [...svg.querySelectorAll('text')].filter((t) => t.textContent.trim() && t.getBoundingClientRect().height > 0)
    .map((t) => ({id: t.id, text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize) * scale}));
}"""

# Every text of every plotly chart, grouped (title, legend, axis titles, ticks, annotations), with its box.
CHART_TEXTS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter((p) => p.getBoundingClientRect().height > 0)
  .map((p) => {
    const frame = p.querySelector('svg.main-svg').getBoundingClientRect();
    const groups = {title: '.gtitle', legend: '.legendtext', xtitle: '.xtitle', ytitle: '.ytitle',
                    xtick: '.xtick text', ytick: '.ytick text', note: '.annotation-text'};
    const texts = [];
    for (const [group, sel] of Object.entries(groups)) {
      p.querySelectorAll(sel).forEach((t) => {
        const r = t.getBoundingClientRect();
        if (!t.textContent.trim() || r.width === 0) return;
        texts.push({group, text: t.textContent.slice(0, 30), box: [r.left, r.top, r.right, r.bottom],
                    px: parseFloat(t.style.fontSize || getComputedStyle(t).fontSize)});
      });
    }
    return {title: (p.querySelector('.gtitle') || {}).textContent || '?', frame: [frame.left, frame.top, frame.right, frame.bottom], texts};
  })"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def overlaps(a, b, slack: float = 1.0) -> bool:
    return a[0] + slack < b[2] and b[0] + slack < a[2] and a[1] + slack < b[3] and b[1] + slack < a[3]


def chart_problems(charts: list[dict], least_px: float = 16) -> list[str]:
    found = []
    for chart in charts:
        name, texts, f = chart["title"][:30], chart["texts"], chart["frame"]
        for i, a in enumerate(texts):
            if a["px"] < least_px:
                found.append(f"{name}: {a['group']} {a['text']!r} is {a['px']} px")
            if a["box"][0] < f[0] - 1 or a["box"][2] > f[2] + 1 or a["box"][1] < f[1] - 1 or a["box"][3] > f[3] + 1:
                found.append(f"{name}: {a['group']} {a['text']!r} is cut off at the chart's edge")
            for b in texts[i + 1 :]:
                if (a["group"] != b["group"] or a["group"] == "legend") and overlaps(a["box"], b["box"]):
                    found.append(f"{name}: {a['group']} {a['text']!r} overlaps {b['group']} {b['text']!r}")
    return found


def open_page(browser, url: str, width: int = 1280, height: int = 900, dark: bool = False):
    page = browser.new_page(viewport={"width": width, "height": height}, color_scheme="dark" if dark else "light")
    page.goto(url)
    return page


def cook_and_wait_for_the_last_frame(page) -> None:
    """Cook, wait for the panels' numbers and the diagnosis, then for the replay's last frame."""
    page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
    page.get_by_role("button", name="Cook").click()
    served = page.locator("#tpk-phase").filter(has_text="Every table served")
    served.wait_for(state="detached", timeout=60_000)  # this Cook's drawing, not the last order's last frame
    page.get_by_text("Diagnosis:", exact=False).first.wait_for(timeout=COOK_TIMEOUT_MS)
    served.wait_for(timeout=60_000)


def scene_text(page, element_id: str) -> str:
    return page.locator(f"#{element_id}").text_content()


def test_the_same_order_in_two_fresh_sessions_cooks_every_prompt_token_and_reuse_says_how_many(server, browser):  # noqa: F811
    order = server + "/?prompt=200&batch=4&new=4&temp=0&live=0"
    ttft, notes = [], []
    for _ in range(2):  # two fresh sessions, as two students (or a reload) would
        page = open_page(browser, order)
        try:
            cook_and_wait_for_the_last_frame(page)
            ttft.append(float(re.match(r"[\d,.]+", metric_value(page, "TTFT")).group().replace(",", "")))
            notes.append(scene_text(page, "tpk-wok-note"))
            assert page.get_by_text("reused", exact=False).count() == 0
        finally:
            page.close()
    # No hidden reuse, counted: both fresh cooks put every prompt token through the wok (4 tables x
    # 200), the same on any machine. (Their TTFTs are only shown: a busy neighbour alone can make two
    # fresh cooks differ several-fold, so a ratio of them cannot tell reuse from load.)
    assert notes == ["800 tokens cooked in the pass"] * 2, (notes, ttft)
    page = open_page(browser, order)
    try:  # the Leftovers lesson: reuse on, the same order twice
        page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
        page.get_by_text("Reuse leftovers").click()
        page.wait_for_timeout(800)  # the rerun that records the choice
        cook_and_wait_for_the_last_frame(page)
        # the orders above cooked with reuse off and left nothing: this one starts from an empty counter
        assert scene_text(page, "tpk-wok-note") == "800 tokens cooked in the pass"
        cook_and_wait_for_the_last_frame(page)
        note = scene_text(page, "tpk-wok-note")
        assert re.fullmatch(r"[\d,]+ of 800 prompt tokens reused", note), note
        page.get_by_text("prompt tokens reused from leftovers (not cooked)", exact=False).first.wait_for()
        diagnosis = page.locator('[data-testid="stAlert"]').filter(has_text="Diagnosis:").first.inner_text()
        assert "of 800 prompt tokens reused" in diagnosis
    finally:
        page.close()


def test_one_value_per_number_after_a_cook(server, browser):  # noqa: F811
    page = open_page(browser, server + "/?prompt=64&batch=2&new=12&temp=0&live=0")
    try:
        cook_and_wait_for_the_last_frame(page)
        ttft, tpot, tps = (metric_value(page, label) for label in ("TTFT", "TPOT", "Tokens/s"))
        assert scene_text(page, "tpk-pot-timer") == f"TPOT {tpot}"  # the drawing's last frame: the same
        assert scene_text(page, "tpk-pot-rate") == tps
        assert scene_text(page, "tpk-pot-note") == "mean of 11 decode steps"
        assert page.get_by_text("TPOT, mean of 11 steps").count() == 1  # the panel says what it is
        assert page.locator(".tpk-tl-words").inner_text().startswith(f"TTFT {ttft} =")  # the timeline
        diagnosis = page.locator('[data-testid="stAlert"]').filter(has_text="Diagnosis:").first.inner_text()
        assert f"TPOT {tpot}" in diagnosis or "the wok is the bottleneck" in diagnosis or "Balanced" in diagnosis
        page.get_by_text("Why, and what would help").click()
        evidence = page.locator('[data-testid="stExpanderDetails"]').filter(has_text="TTFT").first.inner_text()
        assert f"TTFT {ttft} of E2E" in evidence and f"TPOT {tpot} (mean)" in evidence
    finally:
        page.close()


def test_presenter_mode_at_1024_is_legible_from_the_back_row(server, browser):  # noqa: F811
    page = open_page(browser, server + "/?prompt=64&batch=2&new=8&temp=0&live=0&presenter=1", 1024, 768)
    try:
        page.wait_for_function("() => getComputedStyle(document.documentElement).fontSize === '22px'")
        cook_and_wait_for_the_last_frame(page)
        for label in ("TTFT", "TPOT", "Tokens/s"):
            value = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
            px = value.locator('[data-testid="stMetricValue"]').evaluate("(e) => parseFloat(getComputedStyle(e).fontSize)")
            assert px >= 40, (label, px)
        texts = page.evaluate(SCENE_TEXTS)
        key = {t["id"]: t["px"] for t in texts if t["id"] in ("tpk-wok-timer", "tpk-wok-rate", "tpk-pot-timer",
                                                                "tpk-pot-rate", "tpk-kv-mb", "tpk-kv-tokens")}  # fmt: skip
        assert len(key) == 6 and min(key.values()) >= 28, key
        small = [(t["text"], round(t["px"], 1)) for t in texts if t["px"] < 14]
        assert not small, small
        charts = page.evaluate(CHART_TEXTS)
        assert charts and not chart_problems(charts), chart_problems(charts)
    finally:
        page.close()


# Text sizes and positions do not depend on the theme, so each theme is checked once: light with
# presenter mode off, dark with it on.
@pytest.mark.parametrize("presenter, dark", [(False, False), (True, True)], ids=["plain-light", "presenter-dark"])
def test_no_chart_text_overlaps_or_is_cut_on_the_kitchen_and_the_dashboard(server, browser, presenter, dark):  # noqa: F811
    flag = "&presenter=1" if presenter else ""
    page = open_page(browser, server + f"/?prompt=32&batch=2&new=8&temp=0&live=0{flag}", dark=dark)
    try:
        cook_and_wait_for_the_last_frame(page)
        found = []
        for where in ("kitchen", "dashboard"):
            if where == "dashboard":
                page.goto(server + f"/dashboard?{flag.lstrip('&')}")
                page.locator(".js-plotly-plot").nth(5).wait_for(state="attached", timeout=60_000)
                assert page.locator('[data-testid="stException"]').count() == 0
            for width in WIDTHS:
                page.set_viewport_size({"width": width, "height": 900})
                page.wait_for_timeout(800)  # plotly redraws at the new width
                charts = page.evaluate(CHART_TEXTS)
                assert charts, (where, width)
                found += [f"{where} {width} px: {p}" for p in chart_problems(charts)]
        assert not found, found
    finally:
        page.close()


def test_a_full_class_of_tables_does_not_push_the_drawing_down(server, browser):  # noqa: F811
    offsets = {}
    for batch in (1, 64):
        page = open_page(browser, server + f"/?prompt=8&batch={batch}&new=48&temp=0&live=1", 1024, 768)
        try:
            page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
            page.get_by_role("button", name="Cook").click()
            page.locator(".tpk-class-rail:not([hidden]) .tpk-rail").wait_for(timeout=COOK_TIMEOUT_MS)
            offsets[batch] = page.evaluate("""() => {
              const host = [...document.querySelectorAll('.st-key-kitchen-scene *')].find((e) => e.shadowRoot);
              const root = host ? host.shadowRoot : document;
              return root.querySelector('svg.tpk-svg').getBoundingClientRect().top
                - root.querySelector('.tpk-class-rail').getBoundingClientRect().top;
            }""")
        finally:
            page.close()
    assert offsets[64] <= offsets[1] + 48, offsets  # at most one more row of the rail (it scrolls past three)
