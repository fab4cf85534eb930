"""What one live still frame costs the browser, from a Chromium devtools trace of a live Cook.

The live view's cost to the engine is the browser's work while the engine cooks (ui-overhead.md).
This traces that work: it starts `two-pot-kitchen`, cooks the chef's order in the live view with
headless Chromium, traces each Cook (`devtools.timeline`), and sums the browser's work in the
80 ms after every chunk of the scene's feed that arrived while the order cooked: the renderer's main
thread (its top-level tasks, and Layout and Paint inside them), raster tasks, and every other
thread of the browser (compositor, GPU/viz, network, IO). Medians per frame over the rounds (the
first round is a warm-up).

    HF_HUB_OFFLINE=1 .venv/bin/python docs/benchmarks/frame_cost.py [--rounds 6] [--new 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from ui_overhead_bench import CHROMIUM_ARGS, DONE_JS  # noqa: E402

from kitchen_viz.launch import free_port, spawn, stop, wait_healthy  # noqa: E402

WINDOW_US = 80_000
KEYS = ("main", "layout", "paint", "raster", "other")


def frame_costs(events: list[dict]) -> dict:
    """Per-frame sums (ms) over the windows that follow each feed message after the first two."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    data = [(e["name"], e.get("args", {}).get("data", {})) for e in events if e.get("name", "").startswith("Resource")]
    streams = {d["requestId"] for name, d in data if name == "ResourceSendRequest" and "/two-pot/feed/" in d.get("url", "")}
    messages = sorted(
        e["ts"] for e in events
        if e.get("name") == "ResourceReceivedData" and e["args"]["data"].get("requestId") in streams
    )  # fmt: skip
    # The feed's first message arrives with the Cook's drawing, before the engine starts; the last says done.
    windows = messages[1:-1]
    total = dict.fromkeys(KEYS, 0.0)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or not any(w <= e["ts"] <= w + WINDOW_US for w in windows):
            continue
        thread, ms = names.get((e["pid"], e["tid"]), "?"), e["dur"] / 1e3
        if e["name"] in ("RunTask", "ThreadControllerImpl::RunTask"):
            total["main" if thread == "CrRendererMain" else "other"] += ms
        elif e["name"] in ("Layout", "Paint"):
            total[e["name"].lower()] += ms
        elif e["name"] == "RasterTask":
            total["raster"] += ms
    return {k: v / max(1, len(windows)) for k, v in total.items()} | {"frames": len(windows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright  # lazy: a dev dependency, needed only when this runs

    proc, url = spawn(free_port(), Path(tempfile.mkdtemp()) / "streamlit.log")
    rows = []
    try:
        if not wait_healthy(proc, url):
            return 1
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1250})
            for r in range(args.rounds):
                page.goto(f"{url}/?prompt=32&new={args.new}&batch=1&temp=0&live=1")
                page.get_by_role("button", name="Cook").wait_for(timeout=120_000)
                time.sleep(1)
                browser.start_tracing(page=page, categories=["devtools.timeline", "disabled-by-default-devtools.timeline"])
                page.get_by_role("button", name="Cook").click()
                page.wait_for_function(DONE_JS, polling=250, timeout=120_000)
                trace = json.loads(browser.stop_tracing())
                row = frame_costs(trace["traceEvents"] if isinstance(trace, dict) else trace)
                print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), file=sys.stderr)
                if r and row["frames"]:
                    rows.append(row)
                time.sleep(2)
            browser.close()
    finally:
        stop(proc)
    print(json.dumps({k: round(statistics.median(r[k] for r in rows), 2) for k in KEYS} | {"rounds": len(rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
