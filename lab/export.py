"""Charts to PNG files: plotly figures rendered by kaleido in a headless Chromium.

Why kaleido: it renders exactly what the page shows (same plotly figure), where a matplotlib
re-draw would be a second, drifting copy of every chart. Kaleido 1.x drives a Chrome it finds on
the machine; Debian's is at /usr/bin/chromium, so we point it there when nothing else is set.

Rendering starts a browser (a few seconds), so the page renders on demand (the download button's
data is a callable) and `write_pngs` renders many figures with one browser.

Why kaleido is called here and not through `plotly.io.write_images`: kaleido reports a figure it
could not draw by returning the error, and `write_images` drops that return value, so a failed
chart left no file and no message. On a busy machine a browser can start slowly, or be handed a
figure before its page has run its scripts (kaleido then reports "kaleido_scopes is not defined").
So each chart that did not come out is drawn again in a fresh browser, up to `RENDER_TRIES` times,
and what still fails raises `PngExportError` naming the charts and every error kaleido gave.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import kaleido
import plotly.graph_objects as go

DEBIAN_CHROMIUM = "/usr/bin/chromium"
PNG_SIZE = dict(width=1000, height=520, scale=1)
RENDER_TRIES = 3  # a fresh browser each time
# No MathJax: no chart here uses LaTeX, and kaleido would otherwise load it from a CDN on every page
# (a network request per browser start, which fails offline).
KALEIDO_OPTIONS = dict(mathjax=False)
PNG_MAGIC = b"\x89PNG"


class PngExportError(RuntimeError):
    """Charts Chromium did not draw, with every error kaleido gave for them."""


def use_system_chromium() -> None:
    """Tell kaleido where Chromium is (unless the environment already chose one)."""
    if not os.environ.get("BROWSER_PATH") and Path(DEBIAN_CHROMIUM).exists():
        os.environ["BROWSER_PATH"] = DEBIAN_CHROMIUM


def _why(what: str, problems: list[BaseException]) -> PngExportError:
    seen = list(dict.fromkeys(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}" for e in problems))
    browser = os.environ.get("BROWSER_PATH", "the Chrome kaleido finds")
    return PngExportError(
        f"{what} after {RENDER_TRIES} tries, each in a fresh browser ({browser}): " + ("; ".join(seen) or "no error given")
    )


def figure_png(fig: go.Figure) -> bytes:
    """One figure as PNG bytes."""
    use_system_chromium()
    problems: list[BaseException] = []
    for _ in range(RENDER_TRIES):
        try:
            return kaleido.calc_fig_sync(fig, opts=dict(format="png", **PNG_SIZE), kopts=dict(KALEIDO_OPTIONS))
        except Exception as err:  # noqa: BLE001 - the browser's failure, said in full below
            problems.append(err)
    raise _why("Chromium drew no PNG of the chart", problems)


def slug(text: str) -> str:
    """A file-name-safe version of a chart title: 'TTFT vs length' -> 'ttft-vs-length'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "chart"


def _is_png(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(PNG_MAGIC)) == PNG_MAGIC
    except OSError:
        return False


def write_pngs(figs: list[go.Figure], paths: list[Path]) -> list[Path]:
    """Render several figures to PNG files with one browser session (a fresh one for any retry)."""
    use_system_chromium()
    paths = [Path(p) for p in paths]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.unlink(missing_ok=True)  # an earlier file must not pass for this render
    problems: list[BaseException] = []
    for _ in range(RENDER_TRIES):
        todo = [(f, p) for f, p in zip(figs, paths, strict=True) if not _is_png(p)]
        if not todo:
            break
        specs = [{"fig": f, "path": p, "opts": dict(format="png", **PNG_SIZE)} for f, p in todo]
        try:  # kaleido returns the errors of the figures it could not draw (and writes no file for them)
            problems += kaleido.write_fig_from_object_sync(specs, kopts=dict(KALEIDO_OPTIONS)) or ()
        except Exception as err:  # noqa: BLE001 - the browser did not start or died; said in full below
            problems.append(err)
    missing = [p.name for p in paths if not _is_png(p)]
    if missing:
        raise _why(f"Chromium drew no PNG for {', '.join(missing)}", problems)
    return paths
