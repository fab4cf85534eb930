"""Measuring a plotly chart's text in the browser: every SVG text's real box, its font size, and
which of them overlap, run off the chart or are cut ("…"). Shared by the browser tests of the pages
that draw charts.

    problems = chart_problems(page.evaluate(MEASURE_CHARTS), min_px=16)
"""

from __future__ import annotations

# One record per chart: its SVG's box and every non-empty text in it (plotly's class names the part).
MEASURE_CHARTS = """() => {
  const kinds = ['gtitle', 'g-xtitle', 'g-ytitle', 'g-y2title', 'legendtext', 'annotation-text',
                 'xtick', 'ytick', 'y2tick', 'textpoint', 'bartext', 'slicetext'];
  const charts = [];
  document.querySelectorAll('.js-plotly-plot').forEach((plot) => {
    const svg = plot.querySelector('svg.main-svg');
    if (!svg) return;
    const f = svg.getBoundingClientRect();
    if (f.width === 0) return;
    const texts = [];
    plot.querySelectorAll('svg text').forEach((t) => {
      const s = (t.textContent || '').trim();
      const r = t.getBoundingClientRect();
      if (!s || r.width === 0 || r.height === 0) return;
      const kind = kinds.find((k) => t.classList.contains(k) || t.closest('.' + k)) || 'text';
      texts.push({kind, text: s.slice(0, 48), px: parseFloat(getComputedStyle(t).fontSize),
                  box: [r.left, r.top, r.right, r.bottom]});
    });
    const title = (plot.querySelector('.gtitle') || {}).textContent || `chart ${charts.length + 1}`;
    const areas = [...plot.querySelectorAll('.draglayer .nsewdrag')].map((d) => {
      const r = d.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });
    charts.push({title: title.slice(0, 48), frame: [f.left, f.top, f.right, f.bottom], areas, texts});
  });
  return charts;
}"""


def overlaps(a, b, slack: float = 1.0) -> bool:
    return a[0] + slack < b[2] and b[0] + slack < a[2] and a[1] + slack < b[3] and b[1] + slack < a[3]


def inside(box, frame, slack: float = 1.0) -> bool:
    return box[0] >= frame[0] - slack and box[1] >= frame[1] - slack and box[2] <= frame[2] + slack and box[3] <= frame[3] + slack


def chart_problems(charts: list[dict], min_px: float) -> list[str]:
    """Every text under `min_px`, cut off ("…"), outside its chart, or drawn over another text."""
    found = []
    for c in charts:
        texts = c["texts"]
        for i, a in enumerate(texts):
            where = f"{c['title']!r}: {a['kind']} {a['text']!r}"
            if a["px"] < min_px:
                found.append(f"{where} is {a['px']:g} px (< {min_px:g})")
            if a["text"].endswith("…"):
                found.append(f"{where} is cut short")
            if not inside(a["box"], c["frame"]):
                found.append(f"{where} runs off the chart")
            elif a["kind"] == "textpoint" and c["areas"] and not any(inside(a["box"], r) for r in c["areas"]):
                found.append(f"{where} is cut at the edge of the plot")  # a data label is clipped there
            for b in texts[i + 1 :]:
                if overlaps(a["box"], b["box"]):
                    found.append(f"{where} overlaps {b['kind']} {b['text']!r}")
    return found
