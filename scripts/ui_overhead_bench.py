"""Does watching the kitchen slow the soup pot? TPOT with the live kitchen vs the same request with no UI.

The instrument must not disturb the measurement. This runs one order two ways, alternating:

  no UI      the kitchen's own work function (`kitchen_viz.orders.cook`) on an engine set up the way
             the app sets up its own (`kitchen_viz.engine_process.EngineProcess`: a child process,
             the same threads, on the same cores), with nobody watching (the app server is up but
             idle, no page is cooking);
  live UI    the same order cooked through `two-pot-kitchen` while headless Chromium watches:
             the fragment polls four times a second, the scene animates, the panels update.
             TPOT is read from the page's TPOT panel (two decimals in ms).

Both use the same model, dtype, thread count and order (greedy, seed 0, so the same tokens).
It prints medians over the rounds, the overhead (live / no-UI - 1) and how noisy the machine was
(the spread of each side across rounds, and the load average). Usage:

    .venv/bin/python scripts/ui_overhead_bench.py --rounds 7 --new 128 --prompt 32 --batch 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kitchen_viz.engine_process import EngineProcess  # noqa: E402
from kitchen_viz.launch import free_port, spawn, stop, wait_healthy  # noqa: E402
from kitchen_viz.orders import Order, cook  # noqa: E402
from kitchen_viz.service import engine_threads  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]  # fmt: skip


def parse_ms(text: str) -> float:
    """'14.12 ms' -> 0.01412, '1.20 s' -> 1.2 (seconds)."""
    number = float(re.sub(r"[^\d.]", "", text))
    return number / 1e3 if text.strip().endswith("ms") else number


def tpot_without_ui(engine, order: Order) -> float:
    result = cook(order)(engine, lambda event: None)
    return result.metrics.tpot_s


def tpot_with_live_kitchen(page, url: str, query: str, timeout_ms: int = 120_000) -> float | None:
    """TPOT as the page's panel shows it after one Cook; None (with a screenshot) if it never finished."""
    page.goto(f"{url}/{query}")
    page.get_by_role("button", name="Cook").wait_for(timeout=timeout_ms)
    page.get_by_role("button", name="Cook").click()
    done = page.get_by_text("Diagnosis").or_(page.locator('[data-testid="stException"]'))
    try:
        done.first.wait_for(timeout=timeout_ms)  # the diagnosis is shown once the order is done
    except Exception:  # noqa: BLE001 — a stuck round is reported, not fatal
        page.screenshot(path=str(Path(tempfile.gettempdir()) / f"ui-bench-stuck-{time.time():.0f}.png"))
        return None
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="TPOT").first
    value = metric.locator('[data-testid="stMetricValue"]').inner_text()
    time.sleep(3)  # watch a few seconds of the replay, then leave: the next no-UI round runs unwatched
    page.goto("about:blank")
    return parse_ms(value)


def spread(xs: list[float]) -> float:
    """(max - min) / median: how far apart repeated runs of the same thing landed."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--new", type=int, default=128, help="max new tokens (bowls per table)")
    ap.add_argument("--prompt", type=int, default=32, help="generated prompt length, tokens")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--model", default="chef")
    ap.add_argument(
        "--quiet-view", action="store_true", help="the page's 'Live view while the engine runs' off"
    )
    ap.add_argument(
        "--reduced-motion", action="store_true", help="the watching browser prefers reduced motion"
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="engine threads on both sides (default: the app's)"
    )
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    order = Order(
        batch=args.batch, max_new_tokens=args.new, temperature=0.0, seed=0, prompt_tokens=args.prompt
    )
    query = f"?prompt={args.prompt}&new={args.new}&batch={args.batch}&temp=0" + (
        "&live=0" if args.quiet_view else "&live=1"
    )
    threads = args.threads or engine_threads()
    os.environ["TWO_POT_THREADS"] = str(threads)  # the app's kitchen reads it: the same count on both sides
    reference = EngineProcess(args.model, "cpu", "float32", threads=threads)  # pinned like the app's engine
    engine = reference.proxy
    load_before = os.getloadavg()
    log = Path(tempfile.mkdtemp()) / "streamlit.log"
    proc, url = spawn(free_port(), log)
    no_ui, live, stuck = [], [], 0
    try:
        if not wait_healthy(proc, url):
            print(log.read_text(), file=sys.stderr)
            return 1
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            motion = "reduce" if args.reduced_motion else "no-preference"
            page = browser.new_page(viewport={"width": 1500, "height": 1250}, reduced_motion=motion)
            tpot_with_live_kitchen(page, url, query)  # warm-up: loads the server's engine
            tpot_without_ui(engine, order)  # warm-up
            for r in range(args.rounds):
                a, b = tpot_without_ui(engine, order), tpot_with_live_kitchen(page, url, query)
                if b is None:
                    stuck += 1
                    print(f"round {r + 1}: the live order did not finish; round dropped", file=sys.stderr)
                    continue
                no_ui.append(a)
                live.append(b)
                print(
                    f"round {r + 1}: no UI {a * 1e3:.2f} ms, live kitchen {b * 1e3:.2f} ms", file=sys.stderr
                )
            browser.close()
    finally:
        stop(proc)
        reference.close()
    a, b = statistics.median(no_ui), statistics.median(live)
    report = {
        "model": args.model,
        "order": {"prompt_tokens": args.prompt, "max_new_tokens": args.new, "batch": args.batch},
        "rounds": args.rounds,
        "engine_threads": threads,
        "engine_cores": sorted(reference.cores.engine) if reference.cores else None,
        "reduced_motion": args.reduced_motion,
        "live_view": not args.quiet_view,
        "rounds_dropped": stuck,
        "tpot_no_ui_s": no_ui,
        "tpot_live_s": live,
        "median_no_ui_s": a,
        "median_live_s": b,
        "overhead": b / a - 1,
        "spread_no_ui": spread(no_ui),
        "spread_live": spread(live),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
