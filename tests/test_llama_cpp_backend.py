"""The app's class pages against a real llama.cpp server (optional: runs where a llama-server build and
the chef as GGUF are at hand, `LLAMA_SERVER` and `CHEF_GGUF`; skipped elsewhere, as in CI).

What works is measured at the client; what llama.cpp cannot give (the class board, per-step
timings, latency histograms, the Kitchen's engine events) is one info line on each page, never an error."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import use_settings
from proc_kit import telling

from serving.clients.remote_order import board, models, order_remote
from serving.clients.scrape import scrape, window

REPO = Path(__file__).resolve().parents[1]
LLAMA = os.environ.get("LLAMA_SERVER", "/work/peers/llama.cpp/build/bin/llama-server")
GGUF = os.environ.get("CHEF_GGUF", "/work/peers/gguf/chef-f32.gguf")
pytestmark = pytest.mark.skipif(not (Path(LLAMA).is_file() and Path(GGUF).is_file()),
                                reason="no llama-server build and chef GGUF here (scripts/llama_cpp_backend.py)")  # fmt: skip


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    proc = subprocess.Popen([LLAMA, "-m", GGUF, "--host", "127.0.0.1", "--port", str(port), "--metrics", "-c", "2048",
                             "--parallel", "4"], stdout=log.open("w"), stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-2000:]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    with telling(proc, log, "llama-server"):
        yield url
    proc.terminate()
    proc.wait(20)


def test_an_order_is_measured_at_the_client(llama):
    out = order_remote(llama, models(llama)[0], "ROMEO:", 16, 0.0, logprobs=1)
    assert out.text and out.ttft_s > 0 and len(out.chunk_times) >= 2 and out.server_steps == []
    assert board(llama) is None  # no class board: the page shows no rail
    assert len(out.token_logprobs) == 16 and all(lp <= 0 for _, lp in out.token_logprobs)  # llama.cpp's own


def test_its_metrics_read_under_its_own_names(llama):
    before = scrape(llama)
    order_remote(llama, models(llama)[0], "ROMEO:", 16, 0.0)
    w = window(before, scrape(llama))
    assert before.prefix == "llamacpp:" and "num_requests_running" in before.gauges
    assert w.tokens_per_s > 0 and not w.histograms and w.requests_per_s is None


@pytest.mark.parametrize("page, words", [
    ("class_order.py", "sends no per-step timings"),
    ("the_pass.py", "has no latency histograms"),
    ("kitchen.py", "not a Two-Pot kitchen server"),
])  # fmt: skip
def test_each_page_says_what_llama_cpp_cannot_give_in_one_info_line(llama, monkeypatch, page, words):
    from streamlit.testing.v1 import AppTest

    use_settings(monkeypatch, backend=llama)
    # The Kitchen is the app's home page: run it inside the app, whose navigation knows its links.
    path = REPO / "kitchen_viz" / "web" / "app.py" if page == "kitchen.py" else REPO / "kitchen_viz" / "web" / "pages" / page
    app = AppTest.from_file(str(path), default_timeout=120)
    app.run()
    if page == "class_order.py":
        app.button(key="order-go").click().run()
    if page == "kitchen.py":
        for _ in range(60):  # the Kitchen asks the server in the background ("loading" until it has its answer)
            if any(words in i.value for i in app.info):
                break
            time.sleep(0.5)
            app.run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert any(words in i.value and "\n" not in i.value for i in app.info), [i.value for i in app.info]
