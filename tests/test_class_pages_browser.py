"""The pages around the Kitchen, in Chromium, on the app as the README starts it (`two-pot-kitchen`,
which serves the class kitchen itself), with every request to another host refused (offline):

* a link's bad values (`?temp=nan`, `?batch=inf`) are ignored with one line each, and the order
  still cooks;
* every icon is a Material Symbol drawn from the font the app serves (no emoji box), and the tab's
  icon is the app's own file: nothing is fetched from a font CDN;
* the class order page shows one quantity with one label and one format ("Your TTFT" in both
  panels, the same text), and the class's medians under a label of their own;
* the pass says the app serves the class kitchen itself (never "start `two-pot-kitchen serve`"), and
  its chart's axis reads whole orders (never "0.000000");
* after all that cooking, the server's terminal has no Streamlit deprecation warning and no torch
  profiler line.
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlparse

import httpx
import pytest

from tests.browser_kit import app, chromium, needs_chromium
from tests.test_browser import COOK_TIMEOUT_MS

pytestmark = [pytest.mark.browser, needs_chromium]
TERMINAL_NOISE = re.compile(r"deprecat|use_container_width|STAGE:|kineto|profiler", re.IGNORECASE)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(URL, the server's terminal log) of `two-pot-kitchen` on a free port."""
    logs = tmp_path_factory.mktemp("pages")
    with app(logs) as url:
        deadline = time.monotonic() + 180  # the class kitchen opens with the app: wait until it answers
        while httpx.get(url + "/class/health", timeout=5).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        yield url, logs / "streamlit.log"


@pytest.fixture(scope="module")
def offline(served):
    """A browser context that refuses every request to a host other than the app's, and the list of
    what it refused."""
    host = urlparse(served[0]).netloc
    refused: list[str] = []

    def route(r):
        if urlparse(r.request.url).netloc == host or r.request.url.startswith(("data:", "blob:")):
            return r.continue_()
        refused.append(r.request.url)
        return r.abort()

    with chromium() as b:
        context = b.new_context(viewport={"width": 1024, "height": 900})
        context.route("**/*", route)
        yield context, refused
        context.close()


def material_icons(page, where: str) -> list[dict]:
    """Each Material icon under `where`: its name and whether the symbols font drew it (the font
    loaded and the glyph is narrower than its ligature's text would be)."""
    return page.evaluate(
        """(where) => [...document.querySelectorAll(`${where} [data-testid="stIconMaterial"], ${where} span[role="img"][translate="no"]`)].map((e) => {
             const font = getComputedStyle(e).fontFamily;
             const size = getComputedStyle(e).fontSize;
             return {name: e.textContent, font,
                     loaded: document.fonts.check(size + ' ' + font.split(',')[0], e.textContent),
                     width: e.getBoundingClientRect().width, px: parseFloat(size)};
           })""",
        where,
    )


def test_a_links_bad_values_get_one_line_each_and_the_order_still_cooks(served, offline):
    url, _ = served
    context, _ = offline
    page = context.new_page()
    try:
        page.goto(url + "/?prompt=8&batch=inf&new=4&temp=nan&live=0")
        page.get_by_text("Ignored ?temp=nan: not a finite number (temp takes a number from 0 to 2).").wait_for(
            timeout=COOK_TIMEOUT_MS)  # fmt: skip
        page.get_by_text("Ignored ?batch=inf: not a finite number").wait_for(timeout=10_000)
        body = page.inner_text("body")
        assert "to nan" not in body and "lowered to" not in body
        temp = page.locator('.st-key-tpk_temp [data-testid="stSliderThumbValue"]').inner_text()
        assert float(temp) == 0.0, temp  # the default, not a blank slider
        page.get_by_role("button", name="Cook").click()
        page.get_by_text("Diagnosis", exact=False).first.wait_for(timeout=COOK_TIMEOUT_MS)
        assert "Ignored ?temp" not in page.inner_text("body")  # said once, not after every rerun
    finally:
        page.close()


def test_every_icon_is_drawn_from_the_apps_own_symbols_font_offline(served, offline):
    url, _ = served
    context, refused = offline
    page = context.new_page()
    try:
        for path, title in (("/class_order", "Order from a class kitchen"), ("/the_pass", "The pass")):
            page.goto(url + path)
            heading = page.locator("h1").filter(has_text=title)
            heading.wait_for(timeout=COOK_TIMEOUT_MS)
            page.wait_for_function("() => document.fonts.status === 'loaded'")
            icons = material_icons(page, "h1")
            assert len(icons) == 1 and icons[0]["loaded"], (path, icons)
            assert icons[0]["width"] <= 1.5 * icons[0]["px"], icons  # a glyph, not the ligature's letters
            assert not re.search("[\U0001f000-\U0001faff\u2600-\u27bf\ufe0f]", heading.inner_text()), heading.inner_text()
        page.goto(url + "/class_order")
        button = page.locator(".st-key-order-go button")
        button.wait_for(timeout=COOK_TIMEOUT_MS)
        icons = material_icons(page, ".st-key-order-go")
        assert len(icons) == 1 and icons[0]["loaded"] and "Order" in button.inner_text(), icons
        favicon = page.evaluate("() => [...document.querySelectorAll('link[rel~=icon]')].map((l) => l.href)")
        assert favicon and all(urlparse(h).netloc == urlparse(url).netloc for h in favicon), favicon
        assert page.request.get(favicon[-1]).ok
        assert not refused, refused  # nothing was asked of a font CDN (or of any other host)
    finally:
        page.close()


def metric(page, label: str, where: str = "") -> str:
    box = page.locator(f'{where} [data-testid="stMetric"]'.strip()).filter(
        has=page.locator('[data-testid="stMetricLabel"]', has_text=re.compile(f"^{re.escape(label)}$")))
    return box.first.locator('[data-testid="stMetricValue"]').inner_text()


def test_the_class_order_page_says_one_number_one_way(served, offline):
    url, _ = served
    context, _ = offline
    page = context.new_page()
    try:
        page.goto(url + "/class_order")
        page.locator(".st-key-order-go button").click(timeout=COOK_TIMEOUT_MS)
        page.get_by_text("The whole class").wait_for(timeout=COOK_TIMEOUT_MS)
        page.get_by_text("Class median TPOT", exact=True).wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        panels = page.locator('[data-testid="stMetric"]')
        labels = [x.strip() for x in panels.locator('[data-testid="stMetricLabel"]').all_inner_texts()]
        assert labels.count("Your TTFT") == 2 and labels.count("Your TPOT") == 2, labels
        ttft = [v.inner_text() for v in panels.filter(has_text="Your TTFT").locator('[data-testid="stMetricValue"]').all()]
        tpot = [v.inner_text() for v in panels.filter(has_text="Your TPOT").locator('[data-testid="stMetricValue"]').all()]
        assert len(set(ttft)) == 1 and len(set(tpot)) == 1, (ttft, tpot)  # the same number, the same digits
        assert "Class median TTFT" in labels and "Class median TPOT" in labels
        body = page.inner_text("body")
        assert "Kitchen TTFT" not in body and "Kitchen's TTFT" not in body
        assert "Your TTFT inside the kitchen" in body
    finally:
        page.close()


def test_the_pass_says_what_is_true_and_counts_whole_orders(served, offline):
    url, _ = served
    context, _ = offline
    page = context.new_page()
    try:
        page.goto(url + "/the_pass")
        page.get_by_text("This app serves the class kitchen itself").wait_for(timeout=COOK_TIMEOUT_MS)
        assert "two-pot-kitchen serve" not in page.inner_text("body")
        # The current chart: while a fragment run redraws it (its figure changed, so Streamlit mounts a new
        # one), the old one stays in the page a moment, marked stale and out of the layout.
        chart = page.locator('.st-key-pass-orders[data-stale="false"] .js-plotly-plot').filter(has_text="Orders in the kitchen")
        chart.wait_for(timeout=60_000)
        page.wait_for_timeout(2500)  # a second reading
        ticks = chart.locator(".ytick text").evaluate_all("(els) => els.map((e) => e.textContent)")
        assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
    finally:
        page.close()


def test_the_servers_terminal_stays_quiet_after_cooking(served, offline):
    """Runs after the pages above cooked (the Kitchen, the class order page): their log holds no
    deprecation warning (each would repeat at every rerun) and no torch profiler line."""
    url, log = served
    context, _ = offline
    page = context.new_page()
    try:
        page.goto(url + "/?prompt=8&batch=2&new=8&temp=0&live=1")
        page.get_by_role("button", name="Cook").click(timeout=COOK_TIMEOUT_MS)
        page.get_by_text("The whole class").wait_for(timeout=COOK_TIMEOUT_MS)  # the batch chart drawn too
        page.get_by_text("Diagnosis", exact=False).first.wait_for(timeout=COOK_TIMEOUT_MS)
    finally:
        page.close()
    noise = [line for line in log.read_text().splitlines() if TERMINAL_NOISE.search(line)]
    assert not noise, noise[:5]
