"""The lab's page list: one place that says which experiment pages exist and in what order.

Why a registry: `app.py` builds its "Lab" navigation section from `LAB_PAGES` (plus `DASHBOARD`),
so adding an experiment is one line here and one file in `pages/`, with no edit to the app shell.
The order follows the two-pot story: the wok first (prefill), then the pot (decode), the roofline
that explains both, the serving counter (KV cache), the portioning station (per-step overhead), the
prep standard (padding), and finally how the numbers are defined.

Example (what app.py does):
    sections = {"Lab": [st.Page(p.path, title=p.title, icon=p.icon) for p in LAB_PAGES + [DASHBOARD]]}
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LabPage:
    path: str  # relative to the repository root, as st.Page expects
    title: str
    icon: str


LAB_PAGES: list[LabPage] = [
    LabPage("pages/lab_banquet.py", "Big banquet: TTFT vs prompt length", "🍲"),
    LabPage("pages/lab_tables.py", "More tables: batch size", "🍽️"),
    LabPage("pages/lab_roofline.py", "Roofline: what limits each pot", "📈"),
    LabPage("pages/lab_kv_cache.py", "KV cache: keep the soup warm", "🔥"),
    LabPage("pages/lab_overhead.py", "Portioning station: per-step overhead", "⏱️"),
    LabPage("pages/lab_padding.py", "Prep standard: padding waste", "🧺"),
    LabPage("pages/lab_metrics.py", "Metrics, defined", "📏"),
]

DASHBOARD = LabPage("pages/dashboard.py", "Dashboard: all runs", "📊")
