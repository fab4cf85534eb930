"""In a real browser: the engine process dies in the middle of a Kitchen order (SIGKILL), and the
order is not failed: the page ends with the order's answer, the order-to-scale timeline marks the
restart, and the drawing's clock says when it happened.

The app is served by the launcher with a slowed engine (TWO_POT_TEST_HANG_S: the loop pauses after
each step), so the kill lands while the pot ladles; the engine process is found among the app's
own child processes (nothing else on the machine is touched).
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from serving.host.loop import TEST_HANG_ENV
from tests.browser_kit import app_process, chromium, needs_chromium

ORDER = "?prompt=8&new=60&batch=2&temp=0&live=1"  # 60 pot steps of at least 40 ms
TIMEOUT_MS = 180_000

pytestmark = [pytest.mark.browser, needs_chromium]


def engine_processes(app_pid: int) -> list[psutil.Process]:
    """The app's engine loops: the children of its fork server (serving/host/spawn.py; Linux), or its
    children that multiprocessing spawned (`spawn_main`, elsewhere); never the fork server itself."""
    loops = []
    for child in psutil.Process(app_pid).children(recursive=True):
        line, parent = " ".join(child.cmdline()), " ".join(child.parent().cmdline())
        if "spawn_main" in line or ("forkserver" in line and "forkserver" in parent):
            loops.append(child)
    return loops


def test_an_engine_crash_mid_order_is_a_mark_on_the_timeline_not_an_error(tmp_path):
    with app_process(tmp_path, {TEST_HANG_ENV: "0.04"}) as (url, proc), chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        try:
            page.goto(f"{url}/{ORDER}")
            page.get_by_role("button", name="Cook").wait_for(timeout=TIMEOUT_MS)
            page.get_by_role("button", name="Cook").click()
            page.locator("#tpk-phase").filter(has_text="DECODE").wait_for(timeout=TIMEOUT_MS)  # the pot ladles
            (loop,) = engine_processes(proc.pid)
            loop.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            page.get_by_text("Diagnosis:", exact=False).first.wait_for(timeout=TIMEOUT_MS)  # the order ended well
            words = page.locator(".tpk-tl-words").inner_text()
            assert "the engine process restarted at" in words and "the order went on from its" in words, words
            assert page.locator(".tpk-tl-restart").count() == 1  # the mark on the bar
            page.locator("#tpk-phase").filter(has_text="Every table served").wait_for(timeout=TIMEOUT_MS)
            assert "restarted at" in page.locator("#tpk-clock").text_content()
            assert page.locator('[data-testid="stException"]').count() == 0
            assert page.get_by_text("exit code -9", exact=False).count() == 0  # no error line anywhere
            (fresh,) = engine_processes(proc.pid)
            assert fresh.pid != loop.pid and time.monotonic() - killed < TIMEOUT_MS / 1000
            page.screenshot(path=str(tmp_path / "restart.png"), full_page=True)
        finally:
            page.close()
