"""Charts to PNG files: plotly figures rendered by kaleido in a headless Chromium.

Why kaleido: it renders exactly what the page shows (same plotly figure), where a matplotlib
re-draw would be a second, drifting copy of every chart. Kaleido 1.x drives a Chrome it finds on
the machine; Debian's is at /usr/bin/chromium, so we point it there when nothing else is set.

Rendering starts a browser (a few seconds), so the page renders on demand (the download button's
data is a callable) and `write_pngs` renders many figures with one browser.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

DEBIAN_CHROMIUM = "/usr/bin/chromium"
PNG_SIZE = dict(width=1000, height=520, scale=1)


def use_system_chromium() -> None:
    """Tell kaleido where Chromium is (unless the environment already chose one)."""
    if not os.environ.get("BROWSER_PATH") and Path(DEBIAN_CHROMIUM).exists():
        os.environ["BROWSER_PATH"] = DEBIAN_CHROMIUM


def figure_png(fig: go.Figure) -> bytes:
    """One figure as PNG bytes."""
    use_system_chromium()
    return fig.to_image(format="png", **PNG_SIZE)


def slug(text: str) -> str:
    """A file-name-safe version of a chart title: 'TTFT vs length' -> 'ttft-vs-length'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "chart"


def write_pngs(figs: list[go.Figure], paths: list[Path]) -> list[Path]:
    """Render several figures to PNG files with one browser session."""
    use_system_chromium()
    for p in paths:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    pio.write_images(figs, [str(p) for p in paths], format="png", **PNG_SIZE)
    return [Path(p) for p in paths]
