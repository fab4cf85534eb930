"""Screenshots of the Kitchen at projector widths, presenter mode on and off, after one Cook.

Why: a class reads the app from a projector at 1024, 1280, 1366 or 1920 px; these are the
pictures a teacher checks before class (docs/screenshots/, linked from the README). Each shot is
taken after a real Cook on this machine (nothing is staged), saved as a small PNG.

    .venv/bin/python scripts/classroom_screenshots.py [--url http://127.0.0.1:8501] [--out docs/screenshots]

Without --url it starts `two-pot-kitchen` on a free port and stops it afterwards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from kitchen_viz.launch import free_port, spawn, stop, wait_healthy  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
WIDTHS = (1024, 1280, 1366, 1920)
ORDER = "?prompt=64&batch=4&new=32&live=1"
COOK_TIMEOUT_MS = 240_000


def cook_and_shoot(browser, url: str, width: int, presenter: bool, dark: bool, path: Path) -> None:
    page = browser.new_page(
        viewport={"width": width, "height": 3000},  # Streamlit scrolls inside its main area: a tall window
        color_scheme="dark" if dark else "light",
        device_scale_factor=0.6,  # small PNGs for the repository; the layout is the CSS width's
    )
    page.goto(url + "/" + ORDER + ("&presenter=1" if presenter else ""))
    page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
    page.get_by_role("button", name="Cook").click()
    page.get_by_text("Diagnosis", exact=False).first.wait_for(timeout=COOK_TIMEOUT_MS)
    page.wait_for_timeout(4000)  # some of the replay, so the tables have bowls
    bottom = page.evaluate(
        "() => document.querySelector('[data-testid=\"stMainBlockContainer\"]').getBoundingClientRect().bottom"
    )
    page.screenshot(
        path=str(path),
        type="png",
        scale="device",
        clip={"x": 0, "y": 0, "width": width, "height": min(3000, bottom)},
    )
    shrink(path)
    page.close()


def shrink(path: Path) -> None:
    """A 256-colour palette: a screenshot of flat UI keeps its look at a fraction of the bytes."""
    try:
        from PIL import Image  # lazy: Pillow is optional, a screenshot stays unshrunk without it
    except ImportError:
        return
    with Image.open(path) as img:
        img.convert("RGB").quantize(colors=256).save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    ap.add_argument("--dark", action="store_true")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    proc = None
    url = args.url
    if url is None:
        proc, url = spawn(free_port(), Path(tempfile.mkdtemp()) / "streamlit.log")
        if not wait_healthy(proc, url):
            print("the app never became healthy", file=sys.stderr)
            return 1
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            for width in map(int, args.widths.split(",")):
                for presenter in (False, True):
                    name = f"kitchen-{width}{'-presenter' if presenter else ''}{'-dark' if args.dark else ''}.png"
                    cook_and_shoot(browser, url, width, presenter, args.dark, out / name)
                    print(out / name)
            browser.close()
    finally:
        if proc is not None:
            stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
