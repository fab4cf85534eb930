"""The pass: reading a kitchen server's /metrics from outside (serving/scrape.py) and its page."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from kitchen_server import kitchen

from engine.errors import EngineError
from serving.clients.scrape import parse, quantile, scrape, window

REPO = Path(__file__).resolve().parents[1]
TEXT = """# TYPE twopot:inter_token_latency_seconds histogram
twopot:inter_token_latency_seconds_bucket{le="0.001",model_name="chef"} 0.0
twopot:inter_token_latency_seconds_bucket{le="0.002",model_name="chef"} 50.0
twopot:inter_token_latency_seconds_bucket{le="0.004",model_name="chef"} 90.0
twopot:inter_token_latency_seconds_bucket{le="+Inf",model_name="chef"} 100.0
twopot:inter_token_latency_seconds_count{model_name="chef"} 100.0
twopot:inter_token_latency_seconds_sum{model_name="chef"} 0.25
# TYPE twopot:num_requests_running gauge
twopot:num_requests_running{model_name="chef"} 7.0
# TYPE twopot:generation_tokens counter
twopot:generation_tokens_total{model_name="chef"} 1000.0
"""


def test_percentiles_from_bucket_deltas_like_histogram_quantile():
    old = parse(TEXT.replace("50.0", "0.0").replace("90.0", "0.0").replace(" 100.0", " 0.0")
                .replace("1000.0", "0.0"), t=0.0)  # fmt: skip
    new = parse(TEXT, t=10.0)
    w = window(old, new)
    assert w.itl_s["p50"] == pytest.approx(0.002)  # the 50th of 100 gaps is the last in (1 ms, 2 ms]
    assert w.itl_s["p90"] == pytest.approx(0.004)
    assert w.itl_s["p99"] == pytest.approx(0.004)  # beyond the last finite bound: the bound
    assert w.running == 7 and w.tokens_per_s == pytest.approx(100.0)
    assert quantile(0.25, [(0.001, 0.0), (0.002, 50.0), (float("inf"), 100.0)]) == pytest.approx(0.0015)
    assert quantile(0.5, [(0.001, 0.0), (float("inf"), 0.0)]) is None  # nothing observed


def test_vllm_names_are_read_too_and_other_pages_refused():
    assert parse(TEXT.replace("twopot:", "vllm:")).gauges["num_requests_running"] == 7
    with pytest.raises(EngineError, match="no twopot:, vllm: or llamacpp: metrics"):
        parse("# TYPE x gauge\nx 1\n")


def test_a_real_kitchen_read_from_outside_and_its_page():
    from streamlit.testing.v1 import AppTest

    with kitchen() as (url, _):
        before = scrape(url)
        for _ in range(3):
            r = httpx.post(url + "/v1/completions", json={"model": "chef", "prompt": "ROMEO:", "max_tokens": 8,
                                                          "temperature": 0}, timeout=60)  # fmt: skip
            assert r.status_code == 200
        w = window(before, scrape(url))
        assert w.observed["time_to_first_token_seconds"] == 3 and w.observed["inter_token_latency_seconds"] == 21
        assert 0 < w.ttft_s["p50"] <= w.ttft_s["p99"] and w.itl_s["p50"] > 0 and w.running == 0
        assert w.tokens_per_s > 0
        page = AppTest.from_file(str(REPO / "kitchen_viz" / "web" / "pages" / "the_pass.py"), default_timeout=60)
        page.session_state["pass-url"] = url
        page.run()
        assert not page.exception
        labels = {m.label: m.value for m in page.metric}
        assert labels["Orders cooking (running)"] == "0" and labels["Orders waiting for a seat"] == "0"
        assert any("policy `chunked`" in m.value for m in page.markdown)
    with pytest.raises(EngineError, match="could not read"):
        scrape(url, timeout_s=1)
    page.run()
    assert not page.exception and any("Is `two-pot-kitchen serve` running" in e.value for e in page.error)
