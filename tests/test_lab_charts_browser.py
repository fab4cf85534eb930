"""Every lab page's charts on a classroom projector: at 1024, 1280 and 1920 px, presenter mode off
and on, light and dark, no chart text overlaps another, runs off its chart or is cut short, and in
presenter mode none is under 16 px. Measured on the real SVG text boxes in headless Chromium, on the
app as the README starts it (`two-pot-kitchen`).

What the pages show: the Big banquet is Run on its page (the learner's path: guess, Run, charts).
Every other experiment is measured once here on the chef with small settings (seconds each, the
same runs the compute tests make) and stored in the page's result cache under the key of the
page's own default settings, so its page shows that stored measurement after the guess: the path
a second visitor takes, drawn by the same figures code. Running every page's defaults would take
many minutes of both cores.

The charts' text is sized and placed in px by `lab.plot_kit.readable`, independent of the theme,
so the dark theme is checked with presenter mode on and the light one with it off (the banquet
page gets all four).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from engine import Engine
from lab.apprentice import ApprenticeSettings
from lab.banquet import BanquetSettings
from lab.cache import ResultCache, cache_key, model_fingerprint
from lab.dinner_rush import RushSettings
from lab.experiment import default_settings
from lab.kv_cache import KvSettings
from lab.leftovers import LeftoversSettings
from lab.metrics_defs import MetricsSettings
from lab.overhead import OverheadSettings
from lab.padding import PaddingSettings
from lab.registry import EXPERIMENTS
from lab.roofline_lab import RooflineSettings
from lab.smaller_portions import PortionSettings
from lab.stall import StallSettings
from lab.tables import TablesSettings
from lab.two_kitchens_lab import TwoKitchensSettings
from tests.browser_kit import app, chromium, needs_chromium
from tests.chart_text import MEASURE_CHARTS, chart_problems
from tests.proc_kit import run

pytestmark = [pytest.mark.browser, needs_chromium]

WIDTHS = (1024, 1280, 1920)
PRESENTER_MIN_PX = 16
PLAIN_MIN_PX = 12
# Terms of art a teacher should not meet in a page's main text (they live in tooltips and the
# "Engineer's details" expanders).
JARGON = re.compile(r"\bα\b|\balpha\b|\bacceptance\b|Leviathan|Sarathi|max_seqs|\bHTTP\b|\bpid\b|"
                    r"bytes per token|https?://", re.IGNORECASE)
MAIN_TEXT = """() => [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stMarkdownContainer"], '
  + '[data-testid="stMain"] [data-testid="stCaptionContainer"], [data-testid="stMain"] .gtitle, '
  + '[data-testid="stMain"] .legendtext, [data-testid="stMain"] .g-xtitle, [data-testid="stMain"] .g-ytitle')]
  .filter((e) => !e.closest('[data-testid="stExpander"]') && !e.closest('[data-testid="stSidebar"]'))
  .map((e) => e.textContent).join(' \u2022 ')"""
REPO = Path(__file__).resolve().parents[1]
FILL_S = 300  # measuring the small settings of twelve pages
RUN_S = 300  # the banquet's Run and any page's first load, on a busy 2-core machine

SMALL = {  # what is stored for the pages not Run here: real runs that take seconds
    "tables": TablesSettings(batches=(1, 4, 16), prompt_len=16, new_tokens=8),
    "roofline": RooflineSettings(prompt_lens=(16, 128), batches=(1, 4), new_tokens=4),
    "kv_cache": KvSettings(prompt_len=16, new_tokens=64),
    "overhead": OverheadSettings(prompt_len=16, new_tokens=8),
    "portions": PortionSettings(prompt_len=8, new_tokens=4, prefill_tokens=32, agreement_tokens=8),
    "padding": PaddingSettings(lengths=(8, 24, 64)),
    "metrics": MetricsSettings(prompt_len=64, new_tokens=10),
    "dinner_rush": RushSettings(requests=12, rate=80.0, long_answer=48, long_every=4),
    "stall": StallSettings(tables=2, table_answer=16, join_after=4, banquet_prompt=128, budgets=(16, 64)),
    "apprentice": ApprenticeSettings(k=3, new_tokens=16, batches=(1, 4)),
    "leftovers": LeftoversSettings(prompt_len=200, shares=(0.5, 0.9), repeats=3, orders=6, max_seqs=2),
    "two_kitchens": TwoKitchensSettings(orders=3, short_prompt=8, long_prompt=96, new_tokens=8),
}
RUN_HERE = "banquet"


def fill_cache(folder: str) -> None:
    """Measure every page's small settings on the chef and store them under the page's own key."""
    torch.set_num_threads(1)
    cache = ResultCache(Path(folder))
    engine = Engine.load("chef")
    for exp in EXPERIMENTS:
        if exp.key != RUN_HERE:
            key = cache_key(exp.key, model_fingerprint("chef"), "cpu", "float32", default_settings(exp, engine.info))
            cache.put(key, exp.run(engine, SMALL[exp.key], None))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app with a fresh result cache, holding the small measurements of every page but the banquet.

    They are measured in a fresh process (bounded in time), apart from whatever earlier tests left
    in this one (engine children, Streamlit's caches)."""
    folder = tmp_path_factory.mktemp("charts")
    code = f"from tests.test_lab_charts_browser import fill_cache; fill_cache({str(folder / 'lab-cache')!r})"
    run([sys.executable, "-c", code], cwd=REPO, timeout=FILL_S)
    with app(folder, env={"TWO_POT_LAB_CACHE": str(folder / "lab-cache")}) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def test_every_experiment_but_the_one_run_here_has_small_settings():
    assert sorted(SMALL) == sorted(e.key for e in EXPERIMENTS if e.key != RUN_HERE)
    assert isinstance(default_settings(next(e for e in EXPERIMENTS if e.key == RUN_HERE),
                                       Engine.load("chef").info), BanquetSettings)


def open_results(browser, url: str, key: str, presenter: bool, dark: bool, run: bool):
    """The lab page after the guess (and a Run, if asked), with every chart drawn."""
    page = browser.new_page(viewport={"width": 1280, "height": 1200}, color_scheme="dark" if dark else "light")
    page.goto(f"{url}/lab_{key}?presenter={int(presenter)}&model=chef")  # the measurements stored are the chef's
    guess = page.get_by_placeholder("your guess")
    guess.wait_for(timeout=RUN_S * 1000)
    guess.fill("2")
    guess.press("Enter")
    button = page.get_by_role("button", name="Re-run" if not run else "Run", exact=True)
    button.wait_for(timeout=RUN_S * 1000)
    if run:
        button.click()
    page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=RUN_S * 1000)
    page.wait_for_timeout(1000)
    assert page.locator('[data-testid="stException"]').count() == 0
    return page


def settled(page, timeout_s: float = 15.0) -> list[dict]:
    """The charts' text once two measurements 400 ms apart agree: Streamlit and plotly have finished
    laying the page out again (on a busy machine that takes a while after a resize)."""
    last = None
    for _ in range(int(timeout_s / 0.4)):
        page.wait_for_timeout(400)
        now = page.evaluate(MEASURE_CHARTS)
        if now == last:
            return now
        last = now
    return last


def measure_widths(page, min_px: float) -> list[str]:
    failures = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1200})
        charts = settled(page)
        if not charts or not all(c["texts"] for c in charts):
            failures.append(f"{width} px: no chart text drawn")
        failures += [f"{width} px: {p}" for p in chart_problems(charts, min_px)]
    return failures


CASES = [(RUN_HERE, presenter, dark) for presenter in (False, True) for dark in (False, True)] + [
    (e.key, presenter, presenter) for e in EXPERIMENTS if e.key != RUN_HERE for presenter in (False, True)
]


@pytest.mark.parametrize("key, presenter, dark", CASES,
                         ids=[f"{k}-{'presenter' if p else 'plain'}-{'dark' if d else 'light'}" for k, p, d in CASES])
def test_lab_charts_keep_their_text_apart_and_legible(server, browser, key, presenter, dark):
    run = key == RUN_HERE and not presenter and not dark  # the first banquet case Runs; the rest reuse it
    page = open_results(browser, server, key, presenter, dark, run)
    try:
        failures = measure_widths(page, PRESENTER_MIN_PX if presenter else PLAIN_MIN_PX)
        assert not failures, failures
        words = sorted({m.group(0) for m in JARGON.finditer(page.evaluate(MAIN_TEXT))})
        assert not words, f"terms of art in the main text: {words}"
    finally:
        page.close()
