"""The real thing: `two-pot-kitchen` serving the app, headless Chromium pressing Cook.

Starts the launcher on a free port, waits for /_stcore/health, and drives Debian's Chromium
through Playwright. Screenshots are kept under test-artifacts/ (git-ignored) for people to look at.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.browser_kit import CHROMIUM, CHROMIUM_ARGS, app, chromium, needs_chromium  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
COOK_TIMEOUT_MS = 240_000
ORDER = "?new=16&live=1"  # short (16 bowls per table), and watched live: the fragment path under test

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app as a learner starts it (the launcher), on a free port; yields its URL."""
    with app(tmp_path_factory.mktemp("server")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def open_kitchen(browser, url: str, **context):
    page = browser.new_page(viewport={"width": 1500, "height": 1250}, **context)
    page.goto(url + "/" + ORDER)
    page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
    return page


def write_prompt(page, text: str) -> None:
    page.get_by_text("Write a prompt").click()
    box = page.get_by_label("Prompt text (every table orders this)")
    box.fill(text)
    box.press("Control+Enter")  # Streamlit commits a text area on Ctrl+Enter
    page.get_by_text("Your prompt is").wait_for(timeout=60_000)


def metric_value(page, label: str) -> str:
    metric = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return metric.locator('[data-testid="stMetricValue"]').inner_text()


def wait_for_cooked(page) -> None:
    """Until the TTFT panel shows a measured number and the generated text is on the page. A cook
    that never ends fails with what the page showed (and a screenshot), so a failure says where
    the order stood: never started, waiting in line, cooking, or refused."""
    try:
        page.wait_for_function(
            """() => [...document.querySelectorAll('[data-testid="stMetric"]')].some(m =>
                  m.innerText.includes('TTFT') && /\\d/.test(m.querySelector('[data-testid="stMetricValue"]').innerText))""",
            timeout=COOK_TIMEOUT_MS,
        )
        page.get_by_text("Diagnosis", exact=False).first.wait_for(timeout=COOK_TIMEOUT_MS)
        page.locator(".tpk-text span").first.wait_for(timeout=COOK_TIMEOUT_MS)
    except PlaywrightTimeout:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "cook-never-ended.png"), full_page=True)
        status = page.locator('[data-testid="stStatusWidget"]')
        running = status.inner_text() if status.count() else "(no status widget)"
        body = " | ".join(line for line in page.inner_text("body").splitlines() if line.strip())
        pytest.fail(f"the cook never ended; status widget: {running!r}; the page read: {body[-3000:]}")


def full_texts(page) -> list[str]:
    """The generated text of each table, from the 'Full text' expander (its code blocks)."""
    page.get_by_text("Full text, table by table").click()
    blocks = page.locator('[data-testid="stCode"] code')
    blocks.first.wait_for(timeout=30_000)
    return [t.strip() for t in blocks.all_inner_texts()]


def assert_no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0


def test_first_load_shows_the_kitchen_and_cook_measures_real_text(server, browser):
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_kitchen(browser, server)
    page.screenshot(path=str(ARTIFACTS / "kitchen-before-cook.png"), full_page=True)
    page.get_by_role("button", name="Cook").click()
    wait_for_cooked(page)
    ttft = metric_value(page, "TTFT")
    assert re.match(r"^[\d.,]+ (ms|s)$", ttft) and float(re.sub(r"[^\d.]", "", ttft)) > 0
    page.locator(".tpk-svg").wait_for()
    time.sleep(2)  # let the replay run a little so the picture has bowls in it
    page.screenshot(path=str(ARTIFACTS / "kitchen-cooking.png"), full_page=True)
    assert_no_exception(page)
    texts = full_texts(page)
    assert len(texts) == 1 and texts[0]
    page.close()


def test_the_main_view_names_the_step_that_cooks(server, browser):
    """Which forward cooks (the native step and its instruction set, or op by op) is said above the
    order form, visible without opening the engineer's details."""
    page = open_kitchen(browser, server)
    line = page.get_by_text(re.compile(r"every pass runs native \(.+\)")).first
    line.wait_for(timeout=30_000)
    assert line.is_visible()
    page.close()


def test_the_scene_is_not_faded_stale_while_its_fragment_reruns(server, browser):
    """Streamlit's stale fade (an opacity transition started and cancelled at every fragment
    rerun) cost the engine's core CPU at every live tick; the kitchen's CSS switches it off."""
    page = open_kitchen(browser, server)
    scene = page.locator(".st-key-kitchen-scene")
    scene.wait_for()
    style = scene.evaluate("el => [getComputedStyle(el).transitionProperty, getComputedStyle(el).opacity]")
    assert style == ["none", "1"]
    page.close()


def test_while_cooking_live_the_scene_draws_the_panels_then_the_page_draws_them(server, browser):
    """The live panels are part of the scene component while the engine cooks (one element
    updated per update), with measured numbers the order's feed streamed to the scene; once the
    order is done they give way to the ordinary Streamlit panels."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1500, "height": 1250})
    fed = []
    page.on("request", lambda r: fed.append(r.url) if "/two-pot/feed/" in r.url else None)
    page.goto(url_with(server, "?prompt=16&new=480&batch=8&live=1"))  # 8 tables: a cook long enough for several updates
    page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
    page.get_by_role("button", name="Cook").click()
    box = page.locator(".st-key-kitchen-scene .tpk-live-panels")  # Playwright pierces the shadow root
    tpot = box.locator('[data-k="tpot"]').filter(has_text=re.compile(r"\d"))
    tpot.wait_for(timeout=COOK_TIMEOUT_MS)  # visible: the box is shown, with a measured TPOT so far
    assert re.match(r"^[\d.,]+ (ms|s)$", tpot.inner_text())
    page.screenshot(path=str(ARTIFACTS / "kitchen-live-panels.png"), full_page=True)
    wait_for_cooked(page)
    assert re.match(r"^[\d.,]+ (ms|s)$", metric_value(page, "TPOT"))
    assert box.count() == 1
    box.wait_for(state="hidden", timeout=30_000)
    assert_no_exception(page)
    assert len(fed) == 1 and fed[0].endswith("/stream")  # one stream for the whole order: no request per update
    page.close()


def test_the_served_kitchen_watches_live_by_default(server, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1250})
    page.goto(url_with(server, "?new=16"))  # no ?live=: the app's own default
    page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
    assert page.get_by_role("switch", name="Live view").is_checked()
    page.close()


def test_a_scene_that_cannot_read_its_feed_falls_back_to_fragment_ticks(server, browser):
    """With the feed's stream failing to open (a proxy that blocks the path, say), the scene asks
    the page at once to follow the order itself: the cook still ends with measured numbers and text."""
    page = browser.new_page(viewport={"width": 1500, "height": 1250})
    refused = []
    page.route("**/two-pot/feed/**", lambda route: (refused.append(route.request.url), route.abort()))
    page.goto(url_with(server, "?prompt=16&new=480&batch=8&live=1"))  # 8 tables: still cooking when the ticks start
    page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
    page.get_by_role("button", name="Cook").click()
    box = page.locator(".st-key-kitchen-scene .tpk-live-panels")
    box.locator('[data-k="tpot"]').filter(has_text=re.compile(r"\d")).wait_for(timeout=COOK_TIMEOUT_MS)
    wait_for_cooked(page)  # the ticks' numbers reached the live panels, then the final panels
    assert re.match(r"^[\d.,]+ (ms|s)$", metric_value(page, "TPOT"))
    assert len(refused) == 1  # one stream that never opened, then the scene stopped asking
    assert_no_exception(page)
    page.close()


def url_with(url: str, query: str) -> str:
    return url + "/" + query


def test_two_browser_sessions_cooking_at_once_each_get_their_own_text(server, browser):
    from engine import Engine

    orders = {"ROMEO:\n": None, "JULIET:\n": None}
    pages = {}
    for prompt in orders:
        page = open_kitchen(browser, server)
        write_prompt(page, prompt)
        pages[prompt] = page
    for page in pages.values():  # both orders go in before either is done
        page.get_by_role("button", name="Cook").click()
    for prompt, page in pages.items():
        wait_for_cooked(page)
        assert_no_exception(page)
        orders[prompt] = full_texts(page)[0]
    chef = Engine.load("chef")
    for prompt, shown in orders.items():  # greedy and seed 0: what the engine writes for that prompt
        expected = chef.generate([prompt], max_new_tokens=16, temperature=0.0, seed=0).texts[0].strip()
        assert shown == expected
    assert orders["ROMEO:\n"] != orders["JULIET:\n"]
    pages["JULIET:\n"].screenshot(path=str(ARTIFACTS / "kitchen-second-session.png"), full_page=True)
    for page in pages.values():
        page.close()


def test_presenter_mode_and_dark_theme_render_large_and_clean(server, browser):
    page = open_kitchen(browser, server, color_scheme="dark")
    page.get_by_text("Presenter mode (large type)").click()
    page.wait_for_function(
        "() => getComputedStyle(document.documentElement).fontSize === '22px'", timeout=60_000
    )
    page.get_by_role("button", name="Cook").click()
    wait_for_cooked(page)
    time.sleep(2)
    page.screenshot(path=str(ARTIFACTS / "kitchen-presenter-dark.png"), full_page=True)
    assert_no_exception(page)
    page.close()


def test_story_page_links_to_the_lab(server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(server)
    page.get_by_role("link", name="The two-pot story").click()
    page.get_by_text("From the kitchen to the engine").wait_for(timeout=60_000)
    page.get_by_role("link", name=re.compile("Lab: more tables")).wait_for(timeout=60_000)
    assert page.get_by_role("link", name=re.compile("Lab:")).count() >= 5
    page.screenshot(path=str(ARTIFACTS / "story.png"), full_page=True)
    assert_no_exception(page)
    page.close()
