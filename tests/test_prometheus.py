"""A real Prometheus (Debian's `prometheus`, installed by scripts/test.sh) scrapes the class kitchen with
docs/prometheus.yml during a short load; PromQL read back through its HTTP API must agree with what
the server itself reports: requests running (a gauge) exactly, TTFT p99 (histogram_quantile over the
kitchen's buckets) within one bucket of the server's own measurement. Loopback only, bounded."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from kitchen_server import kitchen
from proc_kit import telling

from serving.caps import Caps
from serving.clients.scrape import quantile, scrape
from serving.http.metrics import BUCKETS

PROMETHEUS = shutil.which("prometheus")
CONFIG = Path(__file__).resolve().parent.parent / "docs" / "prometheus.yml"
TTFT = "twopot:time_to_first_token_seconds"
LONG, SHORT = 4, 24  # streams held cooking while the gauge is read; quick orders for the TTFT histogram

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (scripts/test.sh installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def promql(base: str, query: str) -> float | None:
    r = httpx.get(base + "/api/v1/query", params={"query": query}, timeout=5).json()
    assert r["status"] == "success", r
    result = r["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"{what} within {timeout_s:.0f} s")


@pytest.fixture
def prometheus(tmp_path):
    """Yields (prometheus base URL, kitchen URL): Prometheus started with docs/prometheus.yml aimed at
    a fresh kitchen, scraping every second instead of five (the only changes to the file). The
    kitchen runs the torch forward: at the native step's pace the 4 held streams of 480 tokens end
    in about 1 s, one scrape, and Prometheus could miss them; op by op they cook for about 3.5 s."""
    with kitchen(Caps(max_new_tokens=480), native=False) as (url, client):
        text = CONFIG.read_text()
        for old, new in (("127.0.0.1:8000", url.removeprefix("http://")), ("scrape_interval: 5s", "scrape_interval: 1s")):
            assert old in text, f"docs/prometheus.yml no longer has {old!r}"
            text = text.replace(old, new)
        (tmp_path / "prometheus.yml").write_text(text)
        port = free_port()
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            with telling(proc, tmp_path / "prometheus.log", "Prometheus"):
                until(lambda: _ok(base + "/-/ready"), 60, "Prometheus did not become ready")
                until(lambda: promql(base, 'up{job="class-kitchen"}') == 1.0, 30, "Prometheus never scraped the kitchen")
                yield base, url
        finally:
            proc.terminate()
            proc.wait(20)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def stream(url: str, body: dict, ttfts: list) -> None:
    """One streamed order; appends the kitchen's own TTFT for it (the first chunk's `timings`)."""
    with httpx.stream("POST", url + "/v1/completions", json=body | {"stream": True}, timeout=120) as r:
        first = None
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = json.loads(line[6:])["timings"]["ttft_ms"]
        ttfts.append(first / 1e3)


def bucket_of(v: float) -> int:
    return next((i for i, le in enumerate(BUCKETS) if v <= le), len(BUCKETS))


def test_prometheus_reads_what_the_kitchen_reports(prometheus):
    base, url = prometheus
    ttfts: list[float] = []
    long_body = {"prompt": "ROMEO:", "max_tokens": 480, "ignore_eos": True, "temperature": 0}
    held = [threading.Thread(target=stream, args=(url, long_body, ttfts)) for _ in range(LONG)]
    for t in held:
        t.start()
    # requests running: the server's gauge and Prometheus' last scrape of it, both the 4 held streams
    until(lambda: scrape(url).gauges.get("num_requests_running") == LONG, 30, "the server never ran the 4 streams")
    seen = until(lambda: promql(base, "twopot:num_requests_running") == LONG and LONG, 30,
                 "Prometheus never read 4 requests running")  # fmt: skip
    assert seen == LONG  # (the server's own gauge may have moved on since: a quick machine ends the streams)
    quick = [threading.Thread(target=stream, args=(url, {"prompt": f"{i} ROMEO:", "max_tokens": 4}, ttfts))
             for i in range(SHORT)]  # fmt: skip
    for t in quick:
        t.start()
    for t in held + quick:
        t.join(120)
    total = scrape(url).histograms["time_to_first_token_seconds"].count
    assert total == LONG + SHORT and len(ttfts) == LONG + SHORT
    until(lambda: promql(base, f"sum({TTFT}_count)") == total, 20, "Prometheus never scraped the final counts")
    ours = quantile(0.99, list(scrape(url).histograms["time_to_first_token_seconds"].buckets))
    theirs = promql(base, f"histogram_quantile(0.99, sum by (le) ({TTFT}_bucket))")
    assert theirs == pytest.approx(ours, rel=1e-9)  # the same buckets, interpolated alike
    true_p99 = sorted(ttfts)[-1] if len(ttfts) < 100 else sorted(ttfts)[int(0.99 * len(ttfts))]
    assert abs(bucket_of(theirs) - bucket_of(true_p99)) <= 1, (theirs, true_p99)  # within a bucket of the truth
    assert promql(base, "twopot:num_requests_running") == scrape(url).gauges["num_requests_running"] == 0
