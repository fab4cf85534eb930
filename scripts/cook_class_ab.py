"""Two checkouts side by side: the Kitchen's first Cook and the class kitchen's requests/s, alternated.

A change of layout must not slow what a learner sees. This measures, for each checkout, the two
things a teacher notices first, in one run, alternating the checkouts ABBA so a neighbour's load
falls on both alike:

  first Cook   `two-pot-kitchen` launched on a free port, headless Chromium opens the Kitchen at
               `?new=16` (the default order, 16 tokens a table), then: seconds from launch to the
               Cook button, and from pressing Cook to the finished order (TTFT panel measured,
               diagnosis shown): the first Cook pays for the engine process and the model load
  class        `two-pot-kitchen serve --model chef`, then the load generator: 120 requests of
               8..64 prompt ids and 32 new tokens, all there at once, 30 in flight at most (so the
               kitchen, not the arrivals, sets the pace): requests/s over the run, and TTFT p50

Each side runs its checkout's `.venv/bin/python` with the checkout first on PYTHONPATH (its own code,
even where a checkout's `.venv` is a link to another's with the same dependencies). Usage:

    .venv/bin/python scripts/cook_class_ab.py --a /path/to/before --b . --rounds 3 --out ab.json

It prints each side's medians, the B/A ratio, and the spread of each side across rounds (the
noise the ratio is read against).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ONE_SIDE = r'''
import json, subprocess, sys, tempfile, time, importlib
from pathlib import Path
from kitchen_viz.launch import free_port, spawn, stop, wait_healthy
what = sys.argv[1]
out = {}
logs = Path(tempfile.mkdtemp())
if what == "cook":
    from playwright.sync_api import sync_playwright
    t0 = time.monotonic()
    proc, url = spawn(free_port(), logs / "app.log")
    try:
        assert wait_healthy(proc, url, 300), (logs / "app.log").read_text()
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium",
                                  args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = b.new_page(viewport={"width": 1500, "height": 1250})
            page.goto(url + "/?new=16")
            page.get_by_role("button", name="Cook").wait_for(timeout=300_000)
            out["launch_to_cook_button_s"] = time.monotonic() - t0
            t1 = time.monotonic()
            page.get_by_role("button", name="Cook").click()
            page.wait_for_function("""() => [...document.querySelectorAll('[data-testid="stMetric"]')].some(m =>
                m.innerText.includes('TTFT') && /\\d/.test(m.querySelector('[data-testid="stMetricValue"]').innerText))""",
                timeout=300_000)
            page.get_by_text("Diagnosis", exact=False).first.wait_for(timeout=300_000)
            out["first_cook_s"] = time.monotonic() - t1
            b.close()
    finally:
        stop(proc)
else:
    root = Path.cwd()  # the load generator's module in this checkout: before the layout change, or after
    name = "serving.loadgen" if (root / "serving/loadgen.py").exists() else "serving.clients.loadgen"
    loadgen = importlib.import_module(name)
    port = free_port()
    exe = str(Path(sys.executable).parent / "two-pot-kitchen")
    with open(logs / "serve.log", "w") as log:
        proc = subprocess.Popen([exe, "serve", "--model", "chef", "--host", "127.0.0.1", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        import urllib.request
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("the server never became healthy: " + (logs / "serve.log").read_text())
        args = ["--url", url, "--model", "chef", "--requests", "120", "--students", "30", "--rate", "10000",
                "--prompt-len", "uniform:8:64", "--max-tokens", "32", "--json"]
        r = subprocess.run([sys.executable, "-m", loadgen.__name__, *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        out["requests_per_s"] = rep["requests_per_s"]
        out["ttft_p50_s"] = rep["ttft_s"]["p50"]
    finally:
        stop(proc)
print("RESULT " + json.dumps(out))
'''


def one(checkout: Path, what: str) -> dict:
    # PYTHONPATH: the checkout's own packages first, even where two checkouts share one venv
    env = {**os.environ, "PYTHONPATH": str(checkout), "TWO_POT_PREFETCH": "0", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(ONE_SIDE)
    r = subprocess.run([str(checkout / ".venv/bin/python"), f.name, what], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        raise SystemExit(f"{checkout} {what} failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", type=Path, required=True, help="the checkout before")
    p.add_argument("--b", type=Path, required=True, help="the checkout after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    sides = {"a": args.a.resolve(), "b": args.b.resolve()}
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            res = {**one(sides[side], "cook"), **one(sides[side], "class")}
            res["load_avg_1m"] = os.getloadavg()[0]
            runs[side].append(res)
            print(side, r, json.dumps(res), flush=True)
    summary = {}
    for key in ("launch_to_cook_button_s", "first_cook_s", "requests_per_s", "ttft_p50_s"):
        med = {s: statistics.median(x[key] for x in runs[s]) for s in runs}
        spread = {s: (min(x[key] for x in runs[s]), max(x[key] for x in runs[s])) for s in runs}
        summary[key] = {"a_median": med["a"], "b_median": med["b"], "b_over_a": med["b"] / med["a"],
                        "a_range": spread["a"], "b_range": spread["b"]}
        print(f"{key}: A {med['a']:.3f} {spread['a']}  B {med['b']:.3f} {spread['b']}  B/A {med['b'] / med['a']:.3f}")
    if args.out:
        args.out.write_text(json.dumps({"checkouts": {k: str(v) for k, v in sides.items()},
                                        "cpu_count": os.cpu_count(), "runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
