"""In a real browser: Cancel stops the order, and closing the page frees the kitchen.

Streamlit has no "session ended" callback; the kitchen asks the server's runtime whether the
page's session is still connected (kitchen_viz/order_control.py, serving/job.py). Here the app
is served by the launcher with a slow engine (TWO_POT_TEST_HANG_S: the engine's kitchen loop pauses
after each step, so a 480-token order takes minutes), a page Cooks such an order and is closed,
and a second page's small order must then cook long before the first one could have finished.
"""

from __future__ import annotations

import time

import pytest

from serving.host.loop import TEST_HANG_ENV
from tests.browser_kit import app, chromium, needs_chromium

HANG_S = 0.25  # per step: a 480-token order needs 120 s or more
LONG_ORDER = "?prompt=8&new=480&batch=1&live=1"
SMALL_ORDER = "?prompt=8&new=8&batch=1&live=1"
TIMEOUT_MS = 240_000

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The hang is inherited by the server, then by its engine's kitchen loop: a long order stays long.
    with app(tmp_path_factory.mktemp("server"), {TEST_HANG_ENV: str(HANG_S)}) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def cook(browser, url: str, order: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(f"{url}/{order}")
    page.get_by_role("button", name="Cook").wait_for(timeout=TIMEOUT_MS)
    page.get_by_role("button", name="Cook").click()
    return page


def wait_for_measured_ttft(page, timeout_ms: int = TIMEOUT_MS) -> None:
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="stMetric"]')].some(m =>
              m.innerText.includes('TTFT') && /\\d/.test(m.querySelector('[data-testid="stMetricValue"]').innerText))""",
        timeout=timeout_ms,
    )


@pytest.mark.parametrize("live", ["1", "0"])  # watched live, or the quiet view's waiting script run
def test_the_cancel_button_stops_the_order(server, browser, live):
    page = cook(browser, server, LONG_ORDER.replace("live=1", f"live={live}"))
    cancel = page.get_by_role("button", name="Cancel")
    cancel.wait_for(timeout=TIMEOUT_MS)
    time.sleep(2)  # it is cooking
    cancel.click()
    page.get_by_text("Order cancelled: you pressed Cancel.").wait_for(timeout=30_000)
    cancel.wait_for(state="detached", timeout=30_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()


@pytest.mark.parametrize("leave", ["close", "reload"])
def test_closing_or_reloading_the_page_cancels_its_order_and_frees_the_kitchen(server, browser, leave):
    first = cook(browser, server, LONG_ORDER)
    first.get_by_role("button", name="Cancel").wait_for(timeout=TIMEOUT_MS)
    time.sleep(2)  # cooking: about 8 of its 480 tokens are out
    if leave == "close":
        first.close()  # the learner closes the tab
    else:
        first.goto(f"{server}/{SMALL_ORDER}")  # or reloads it (a new session), with a small order
    closed = time.monotonic()
    if leave == "close":
        second = cook(browser, server, SMALL_ORDER)
    else:
        second = first
        second.get_by_role("button", name="Cook").wait_for(timeout=TIMEOUT_MS)
        second.get_by_role("button", name="Cook").click()
    wait_for_measured_ttft(second)
    freed_after = time.monotonic() - closed
    # The first order alone needed 480 x 0.25 s = 120 s more; the kitchen was free long before.
    assert freed_after < 60, f"the second order finished {freed_after:.0f} s after the first page closed"
    assert second.locator('[data-testid="stException"]').count() == 0
    second.close()
