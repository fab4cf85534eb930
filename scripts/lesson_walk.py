"""Walk the lesson plan as a teacher on a projector would, and keep what the class saw.

    python scripts/lesson_walk.py docs/screenshots            # starts `two-pot-kitchen` on a free port
    python scripts/lesson_walk.py OUT --url http://127.0.0.1:8501  # an app already running

One fresh browser session (Debian's Chromium, 1024 x 768, presenter mode on): for each lesson of
the plan in order, the lesson plan's own "Cook this order" link, then Cook, then wait for the
diagnosis and the replay's last frame. A screenshot of the first screen per lesson goes to OUT
(lesson-N.png), and one line per order is printed: its TTFT share of the wall time (TTFT / E2E, as
the panels show them) and the inspector's verdict. Every number is read off the page, as measured
on this machine a moment before.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kitchen_viz.launch import free_port, spawn, stop, wait_healthy  # noqa: E402
from kitchen_viz.lessons import LESSONS  # noqa: E402
from tests.browser_kit import chromium  # noqa: E402

WIDTH, HEIGHT = 1024, 768
COOK_TIMEOUT_MS = 600_000  # a lesson on the assistant may first wait for its one-time fetch
UNITS = {"ms": 1e-3, "s": 1.0}


@contextmanager
def launched_app():
    """`two-pot-kitchen` as the README's command ends up running it (the launcher), on a free port."""
    logs = Path(tempfile.mkdtemp(prefix="lesson-walk-"))
    proc, url = spawn(free_port(), logs / "streamlit.log")
    try:
        if not wait_healthy(proc, url, timeout_s=180):
            raise SystemExit(f"the app never became healthy; its log: {logs / 'streamlit.log'}")
        yield url
    finally:
        stop(proc)


def seconds(text: str) -> float | None:
    """"52.37 ms" -> 0.05237; "1.21 s" -> 1.21; "—" -> None."""
    m = re.fullmatch(r"([\d,.]+)\s*(ms|s)", text.strip())
    return float(m.group(1).replace(",", "")) * UNITS[m.group(2)] if m else None


def panel(page, label: str) -> str:
    """A panel's value by its label; TTFT of an order of several tables reads "TTFT, every table"."""
    box = page.locator(".st-key-tpk-panels [data-testid='stMetric']").filter(
        has=page.locator("[data-testid='stMetricLabel']", has_text=re.compile(f"^{label}(, every table)?$")))
    return box.first.locator("[data-testid='stMetricValue']").inner_text()


def cook_lesson(page, number: int) -> dict:
    page.get_by_role("link", name="Suggested orders (lesson plan)").click()
    page.get_by_role("link", name="Cook this order").nth(number - 1).click()
    cook = page.get_by_role("button", name="Cook")
    cook.wait_for(timeout=COOK_TIMEOUT_MS)
    page.wait_for_function("() => ![...document.querySelectorAll('button')].some((b) => b.innerText.trim() === 'Cook' && b.disabled)",
                           timeout=COOK_TIMEOUT_MS)  # fmt: skip
    cook.click()
    page.get_by_text("Diagnosis:", exact=False).first.wait_for(timeout=COOK_TIMEOUT_MS)
    page.locator("#tpk-phase").filter(has_text="Every table served").wait_for(timeout=120_000)
    alert = page.locator("[data-testid='stAlert']").filter(has_text="Diagnosis:").first
    verdict = alert.inner_text().split("Diagnosis:", 1)[-1].strip()
    return {"ttft": panel(page, "TTFT"), "e2e": panel(page, "E2E"), "verdict": " ".join(verdict.split())}


def walk(url: str, out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        page.goto(url + "/?presenter=1")
        page.get_by_role("link", name="Suggested orders (lesson plan)").wait_for(timeout=COOK_TIMEOUT_MS)
        for number, lesson in enumerate(LESSONS, start=1):
            got = cook_lesson(page, number)
            page.evaluate("() => window.scrollTo(0, 0)")
            page.wait_for_timeout(500)
            page.screenshot(path=str(out / f"lesson-{number}.png"))
            ttft, e2e = seconds(got["ttft"]), seconds(got["e2e"])
            share = f"{ttft / e2e:.0%}" if ttft is not None and e2e else "—"
            line = (f"{number}. {lesson.title} [{lesson.model.name}]: TTFT {got['ttft']} of E2E {got['e2e']} "
                    f"(TTFT share {share}) · {got['verdict']}")  # fmt: skip
            print(line, flush=True)
            lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the app it started stops too
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="folder for the screenshots (lesson-N.png)")
    p.add_argument("--url", help="an app already running (default: start `two-pot-kitchen` on a free port)")
    args = p.parse_args(argv)
    with ExitStack() as stack:
        url = args.url or stack.enter_context(launched_app())
        walk(url.rstrip("/"), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
