"""Does watching the kitchen slow the soup pot? TPOT with the live view on vs off, on the one kitchen host.

The instrument must not disturb the measurement. This runs one order two ways through the same
`two-pot-kitchen` server, the same kitchen host and the same engine (its kitchen-loop process),
alternating:

  no UI      the quiet view (`?live=0`): nothing is drawn while the order cooks;
  live UI    the live view (`?live=1`) while headless Chromium watches the scene.

Both TPOTs are read from the page's TPOT panel once the order is done (the engine's own
`metrics.tpot_s`, two decimals in ms). With --quiet-view both sides are the quiet page: an A/A
check of the instrument itself (two identical rounds can differ by more than the 3 % budget, so
the A/A spread is the noise floor any overhead is read against).

Where things run (2 cores: the engine's loop on core 1, the server on core 0): this process and
Playwright's driver run on the server's cores; Chromium runs on every core like a real browser, or
on the server's cores with --pin-browser (report both). --perf traces the engine's core during
every Cook and says who else ran there, how often and for how long, and how many cores Chromium
kept busy inside the cook (both sides). Both sides use the same model,
dtype, threads and order (greedy, seed 0: the same tokens), alternating ABBA across rounds.

It prints medians over the rounds, the overhead (live / no-UI - 1) and how noisy the machine was
(the spread of each side across rounds, and the load average). Usage:

    .venv/bin/python scripts/ui_overhead_bench.py --rounds 15
    .venv/bin/python scripts/ui_overhead_bench.py --rounds 15 --quiet-view   # A/A
    .venv/bin/python scripts/ui_overhead_bench.py --rounds 7 --pin-browser
    .venv/bin/python scripts/ui_overhead_bench.py --rounds 5 --perf
    .venv/bin/python scripts/ui_overhead_bench.py --pool docs/benchmarks/ui-overhead.json

--pool reads a results file (`{"series": [...]}`, each series one run's report with a "code" label)
and pools the rounds of every series with the same code and kind (live or A/A): more rounds, a
narrower interval, the same rule.
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

from engine.bench.cook_probe import CoreProbe, cpu_list  # noqa: E402
from engine.bench.report import paired  # noqa: E402
from kitchen_viz.launch import free_port, spawn, stop, wait_healthy  # noqa: E402
from serving.cores import (  # noqa: E402
    ALL_CORES,
    engine_threads,  # noqa: E402
    pin_this_process,
    split_cores,
)

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]  # fmt: skip


def parse_ms(text: str) -> float:
    """'14.12 ms' -> 0.01412, '1.20 s' -> 1.2 (seconds)."""
    number = float(re.sub(r"[^\d.]", "", text))
    return number / 1e3 if text.strip().endswith("ms") else number


# The order is done once the diagnosis (or an exception) is on the page. Checked 4x a second on
# textContent (no forced layout) instead of Playwright's text locator: the harness is not part of
# the UI, and with --perf its driver and this process showed up on the engine's core.
DONE_JS = "() => /Diagnosis/.test(document.body.textContent) || !!document.querySelector('[data-testid=stException]')"
POLL_MS = 250


def tpot_with_live_kitchen(
    page, url: str, query: str, timeout_ms: int = 120_000, probe=None, side: str = "live"
) -> float | None:
    """TPOT as the page's panel shows it after one Cook; None (with a screenshot) if the page never
    offered Cook or the order never finished (the round is then dropped and counted).

    `probe`: a CoreProbe, started just before Cook and stopped once the order is done, its row
    filed under `side`."""
    try:
        page.goto(f"{url}/{query}")
        page.get_by_role("button", name="Cook").wait_for(timeout=timeout_ms)
        if probe is not None:
            probe.start()
        page.get_by_role("button", name="Cook").click()
        page.wait_for_function(DONE_JS, polling=POLL_MS, timeout=timeout_ms)
        if probe is not None:
            probe.stop(side)
    except Exception:  # noqa: BLE001 — a stuck round is reported, not fatal
        if probe is not None:
            probe.abandon()
        page.screenshot(path=str(Path(tempfile.gettempdir()) / f"ui-bench-stuck-{time.time():.0f}.png"))
        return None
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="TPOT").first
    value = metric.locator('[data-testid="stMetricValue"]').inner_text()
    time.sleep(3)  # watch a few seconds of the replay, then leave: the next no-UI round runs unwatched
    page.goto("about:blank")
    return parse_ms(value)


def chromium_on(cores, folder: Path) -> str:
    """An executable that starts Debian's Chromium with its affinity set to `cores` (every process
    it starts inherits it)."""
    wrapper = folder / "chromium"
    wrapper.write_text(f'#!/bin/sh\nexec taskset -c {cpu_list(cores)} /usr/bin/chromium "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def quiet_first(round_index: int) -> bool:
    """ABBA: the no-UI side goes first in rounds 1, 3, 5... (index 0, 2, 4...), the live one in the others."""
    return round_index % 2 == 0


def spread(xs: list[float]) -> float:
    """(max - min) / median: how far apart repeated runs of the same thing landed."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def pool(series: list[dict]) -> list[dict]:
    """Per (code, live or A/A): every round of those series together, as one paired comparison."""
    groups: dict[tuple[str, bool], list[dict]] = {}
    for s in series:
        if "code" in s:
            groups.setdefault((s["code"], s["live_view"]), []).append(s)
    out = []
    for (code, live_view), group in groups.items():
        a = [x for s in group for x in s["tpot_no_ui_s"]]
        b = [x for s in group for x in s["tpot_live_s"]]
        p = paired(a, b)
        out.append({"code": code, "live_view": live_view, "series": len(group), "rounds": len(a),
                    "paired_median": p["paired_median"], "paired_ci95": p["paired_ci95"]})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=Path, help="pool the series of a results file by code (see above) and stop")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--new", type=int, default=128, help="max new tokens (bowls per table)")
    ap.add_argument("--prompt", type=int, default=32, help="generated prompt length, tokens")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--model", default="chef")
    ap.add_argument(
        "--quiet-view",
        action="store_true",
        help="the live side's 'Live view' toggle off (with --baseline same-process: an A/A check)",
    )
    ap.add_argument(
        "--reduced-motion", action="store_true", help="the watching browser prefers reduced motion"
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="engine threads on both sides (default: the app's)"
    )
    ap.add_argument(
        "--pin-browser",
        action="store_true",
        help="start Chromium on the server's cores (default: on every core, as a real browser is)",
    )
    ap.add_argument(
        "--perf",
        action="store_true",
        help="trace who holds the engine's core (perf sched_switch) during every Cook, both sides",
    )
    ap.add_argument(
        "--baseline",
        choices=("same-process",),
        default="same-process",
        help="the no-UI side: the quiet page (?live=0) through the same server and kitchen host as the live side",
    )
    args = ap.parse_args(argv)
    if args.pool:
        try:
            series = json.loads(args.pool.read_text())["series"]
            rows = pool(series)
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"error: --pool {args.pool}: not a results file with a 'series' list of reports "
                  f"({type(err).__name__}: {err})", file=sys.stderr)  # fmt: skip
            return 2
        for row in rows:
            lo, hi = row["paired_ci95"]
            kind = "live view" if row["live_view"] else "A/A"
            print(f"{row['code']} · {kind}: {row['series']} series, {row['rounds']} rounds, "
                  f"paired median {row['paired_median']:+.2%} (95 % {lo:+.2%} to {hi:+.2%})")  # fmt: skip
        return 0
    from playwright.sync_api import sync_playwright  # lazy: a dev dependency, only the browser run needs it

    base = f"?prompt={args.prompt}&new={args.new}&batch={args.batch}&temp=0"
    query = base + ("&live=0" if args.quiet_view else "&live=1")
    quiet_query = base + "&live=0"  # the no-UI side
    threads = args.threads or engine_threads()
    split = split_cores(threads)  # the app's kitchen loop is pinned to split.engine (serving/http/mounted.py)

    def no_ui_side() -> float | None:
        return tpot_with_live_kitchen(page, url, quiet_query, probe=probe, side="no_ui")

    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    folder = Path(tempfile.mkdtemp())
    log = folder / "streamlit.log"
    proc, url = spawn(free_port(), log, "--threads", str(threads))  # the app's kitchens run this many
    # The harness (this process and Playwright's driver, started below) runs where the server does:
    # it is not part of the UI, and on the engine's core it showed up in --perf (a person does not
    # run it). Chromium runs on every core unless --pin-browser.
    harness = split.server if split else ALL_CORES
    browser_cores = harness if args.pin_browser else ALL_CORES
    probe = CoreProbe(split.engine, harness, folder) if args.perf and split else None
    no_ui, live, stuck, stuck_sides = [], [], 0, {"no_ui": 0, "live": 0}
    try:
        if not wait_healthy(proc, url):
            print(log.read_text(), file=sys.stderr)
            return 1
        pin_this_process(harness)
        with sync_playwright() as p:
            executable = chromium_on(browser_cores, folder)
            browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            motion = "reduce" if args.reduced_motion else "no-preference"
            page = browser.new_page(viewport={"width": 1500, "height": 1250}, reduced_motion=motion)
            tpot_with_live_kitchen(page, url, query)  # warm-up: loads the server's engine
            no_ui_side()  # warm-up (same-process: the quiet page once)
            if probe is not None:  # the warm-ups are not rounds
                probe.rounds = {"no_ui": [], "live": []}
            for r in range(args.rounds):
                # ABBA: each side goes first in half the rounds (an A/A check of two identical
                # engine children, always in the same order, measured the first one 9-16 % slower)
                if quiet_first(r):
                    a = no_ui_side()
                    b = tpot_with_live_kitchen(page, url, query, probe=probe)
                else:
                    b = tpot_with_live_kitchen(page, url, query, probe=probe)
                    a = no_ui_side()
                if a is None or b is None:
                    stuck += 1
                    stuck_sides["no_ui"] += a is None
                    stuck_sides["live"] += b is None
                    print(
                        f"round {r + 1}: no Cook button or the order never finished; round dropped",
                        file=sys.stderr,
                    )
                    continue
                no_ui.append(a)
                live.append(b)
                seen = (
                    f", engine's core (live): {probe.rounds['live'][-1]}"
                    if probe and probe.rounds["live"]
                    else ""
                )
                print(
                    f"round {r + 1} ({'AB' if quiet_first(r) else 'BA'}): no UI {a * 1e3:.2f} ms, "
                    f"live kitchen {b * 1e3:.2f} ms{seen}",
                    file=sys.stderr,
                )
            browser.close()
    finally:
        stop(proc)
    a, b = statistics.median(no_ui), statistics.median(live)
    report = {
        "model": args.model,
        "order": {"prompt_tokens": args.prompt, "max_new_tokens": args.new, "batch": args.batch},
        "rounds": args.rounds,
        "baseline": args.baseline,
        "no_ui_side": "quiet page ?live=0, same server and kitchen host",
        "tpot_source": "page's TPOT panel (engine's measured metrics.tpot_s)",
        "engine_threads": threads,
        "engine_cores": sorted(split.engine) if split else None,
        "harness_cores": sorted(harness),
        "browser_cores": sorted(browser_cores),
        "reduced_motion": args.reduced_motion,
        "live_view": not args.quiet_view,
        "rounds_dropped": stuck,
        "rounds_dropped_by_side": stuck_sides,
        "order_per_round": ["AB" if quiet_first(r) else "BA" for r in range(args.rounds)],
        "tpot_no_ui_s": no_ui,
        "tpot_live_s": live,
        "median_no_ui_s": a,
        "median_live_s": b,
        "overhead": b / a - 1,
        **paired(no_ui, live),
        "spread_no_ui": spread(no_ui),
        "spread_live": spread(live),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "started_utc": started,
    }
    if probe is not None:
        report["engine_core_during_cook"] = {"median": probe.medians(), "rounds": probe.rounds}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
