"""The app against a real llama.cpp server: llama-server with the chef as GGUF, the app's pages on it.

    .venv/bin/python scripts/llama_cpp_backend.py --llama-server PATH/llama-server --gguf chef-f32.gguf \\
        --shots docs/images --out docs/benchmarks/llama-cpp-backend.json

Optional (not in CI): it needs a llama.cpp build (scripts/build_llama_cpp.sh) and the chef
converted to GGUF (llama.cpp's convert_hf_to_gguf.py on engine/models/chef). It starts
`llama-server -m GGUF --host 127.0.0.1 --port P --metrics`, then:

  1. orders from it as the Order page does (serving/clients/remote_order.py): text, client-side TTFT /
     TPOT / tokens per second, logprobs if it sends them, and whether it keeps a class board;
  2. reads its /metrics as The pass does (serving/clients/scrape.py, llama.cpp's own names);
  3. starts `two-pot-kitchen --backend URL` and, in headless Chromium, opens the Order page (and
     orders), the Kitchen and The pass, saving a screenshot of each and the one-line notes each
     page shows for what llama.cpp cannot give.

Every number printed is measured in this run.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from class_load import start  # noqa: E402
from class_load import stop as stop_server  # noqa: E402

from kitchen_viz.launch import free_port, spawn, stop, wait_healthy  # noqa: E402
from serving.clients.remote_order import board, models, order_remote  # noqa: E402
from serving.clients.scrape import scrape, window  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu"]
PAGES = {"order": "class_order", "kitchen": "", "pass": "the_pass"}


def start_llama(binary: str, gguf: str, port: int, log: Path) -> subprocess.Popen:
    return start([binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--metrics", "-c", "2048",
                  "--parallel", "4"], f"http://127.0.0.1:{port}", "/health", log)  # fmt: skip


def client_side(url: str) -> dict:
    """What the Order page and The pass can measure against it, without a browser."""
    offered = models(url)
    before = scrape(url)
    runs = [order_remote(url, offered[0], "ROMEO:", 32, 0.0, logprobs=1) for _ in range(3)]
    after = scrape(url)
    w = window(before, after)
    last = runs[-1]
    return {
        "models": offered, "text": last.text, "finish_reason": last.finish_reason,
        "ttft_ms": [round(r.ttft_s * 1e3, 2) for r in runs], "tpot_ms": [round(r.tpot_s * 1e3, 3) for r in runs],
        "tokens_per_s": [round(r.tokens_per_s or 0, 1) for r in runs], "completion_tokens": last.completion_tokens,
        "logprobs_sent": len(last.token_logprobs), "server_steps": len(last.server_steps),
        "board": board(url) is not None,
        "metrics": {"prefix": after.prefix, "gauges": after.gauges, "counters": after.counters,
                    "histograms": sorted(after.histograms), "tokens_per_s_window": w.tokens_per_s},
    }  # fmt: skip


def screenshots(app_url: str, shots: Path, llama_url: str) -> dict:
    """Each page in headless Chromium: a screenshot, and the info/error lines it shows. The pass is
    shot while 4 clients order from the server, so its gauges and rates have something to read."""
    import threading  # lazy: only the screenshots run threads

    from playwright.sync_api import (
        sync_playwright,  # lazy: playwright is a dev dependency, only for the screenshots
    )

    busy = threading.Event()

    def orders() -> None:
        while busy.is_set():
            order_remote(llama_url, models(llama_url)[0], "JULIET:", 96, 0.0)

    seen = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1700})
        for name, path in PAGES.items():
            page.goto(f"{app_url}/{path}")
            page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=60_000)
            page.wait_for_timeout(4000)
            if name == "order":
                page.get_by_role("button", name="🔥 Order").click()
                page.wait_for_selector("text=Measured at the client", timeout=120_000)
                page.wait_for_timeout(1500)
            if name == "kitchen":  # it asks the server in the background, then says what it found
                page.wait_for_selector("text=not a Two-Pot kitchen server", timeout=60_000)
            if name == "pass":
                busy.set()
                clients = [threading.Thread(target=orders, daemon=True) for _ in range(4)]
                for c in clients:
                    c.start()
                page.wait_for_timeout(8000)  # several readings, for the rates
            page.screenshot(path=str(shots / f"llama-cpp-{name}.png"), full_page=True)
            busy.clear()
            seen[name] = {
                "info": [t.strip() for t in page.locator("[data-testid='stAlertContentInfo']").all_inner_texts()],
                "errors": [t.strip() for t in page.locator("[data-testid='stAlertContentError']").all_inner_texts()],
                "exceptions": page.locator("[data-testid='stException']").count(),
            }
        browser.close()
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default="/work/peers/llama.cpp/build/bin/llama-server")
    ap.add_argument("--gguf", default="/work/peers/gguf/chef-f32.gguf")
    ap.add_argument("--shots", default=str(REPO / "docs" / "images"))
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "llama-cpp-backend.json"))
    args = ap.parse_args()
    logs, shots = REPO / "test-artifacts", Path(args.shots)
    logs.mkdir(exist_ok=True)
    shots.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    llama = start_llama(args.llama_server, args.gguf, port, logs / "llama-server.log")
    report: dict = {"llama_server": args.llama_server, "gguf": Path(args.gguf).name,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": socket.gethostname()}  # fmt: skip
    try:
        report["client"] = client_side(url)
        app, app_url = spawn(free_port(), logs / "app-llama-cpp.log", "--backend", url)
        try:
            if not wait_healthy(app, app_url):
                raise SystemExit("the app never became healthy: see test-artifacts/app-llama-cpp.log")
            report["pages"] = screenshots(app_url, shots, url)
        finally:
            stop(app)
    finally:
        stop_server(llama)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
