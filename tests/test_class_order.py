"""Ordering from a class kitchen as a student's app does: serving/remote_order.py and its page."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import launched, use_settings
from kitchen_server import kitchen

from engine.errors import EngineError
from serving.clients.remote_order import RemoteOrder, _take, models, order_remote

REPO = Path(__file__).resolve().parents[1]


def test_an_order_measured_at_the_client_and_by_the_kitchen():
    from engine import Engine

    expected = Engine.load("chef").generate(["ROMEO:"], max_new_tokens=12).texts[0]
    with kitchen() as (url, _):
        assert models(url) == ["chef"]
        seen = []
        out = order_remote(url, "chef", "ROMEO:", 12, on_chunk=lambda o: seen.append(o.text))
        assert out.text == expected and seen[-1] == expected and len(seen) == len(out.chunk_times)
        assert out.completion_tokens == 12 and out.prompt_tokens > 0 and out.finish_reason == "length"
        assert 0 < out.ttft_s <= out.done_s and out.tpot_s > 0 and out.tokens_per_s > 0
        assert out.server_ttft_s is not None and 0 < out.server_ttft_s <= out.ttft_s  # no network in it
        assert {s["phase"] for s in out.server_steps} >= {"decode"} and all(s["batch"] >= 1 for s in out.server_steps)
        with pytest.raises(EngineError, match="HTTP 400: .*context"):
            order_remote(url, "chef", "to be or not " * 1200, 8)  # more tokens than any seat holds
        with pytest.raises(EngineError, match="HTTP 404: model 'gpt-4' is not served here"):
            order_remote(url, "gpt-4", "hi", 4)
    with pytest.raises(EngineError, match="could not list the models"):
        models(url, timeout_s=1)


def test_per_token_confidence_is_the_servers_logprobs():
    import math

    from serving.clients.token_confidence import confidence_html, summarize

    with kitchen() as (url, _):
        out = order_remote(url, "chef", "ROMEO:", 12, logprobs=1)
        plain = order_remote(url, "chef", "ROMEO:", 12)
    assert len(out.token_logprobs) == 12 and "".join(t for t, _ in out.token_logprobs) == out.text == plain.text
    assert plain.token_logprobs == [] and all(lp <= 0 for _, lp in out.token_logprobs)
    c = summarize(out.token_logprobs)
    ps = [math.exp(lp) for _, lp in out.token_logprobs]
    assert c.tokens == 12 and c.mean_p == pytest.approx(sum(ps) / 12) and c.least[1] == pytest.approx(min(ps))
    shown = confidence_html(out.token_logprobs)
    assert shown.count('title="p = ') == 12 and f"p = {ps[0]:.3f}" in shown
    assert summarize([]) is None


def test_logprobs_in_the_chat_shape_are_read_too():
    out = RemoteOrder()  # llama-server sends `logprobs.content` on /v1/completions, as its chat route does
    _take(out, {"choices": [{"text": "\n", "index": 0, "logprobs": {"content": [
        {"id": 199, "token": "\n", "bytes": [10], "logprob": -0.00075, "top_logprobs": []}]}}]}, 0.05)  # fmt: skip
    _take(out, {"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}]}, 0.06)
    assert out.token_logprobs == [("\n", -0.00075)]


def test_a_server_without_our_timings_gives_client_numbers_only():
    out = RemoteOrder()
    _take(out, {"choices": [{"index": 0, "text": "Hi"}]}, 0.05)  # a vLLM-style chunk
    _take(out, {"choices": [{"index": 0, "text": " there", "finish_reason": "length"}]}, 0.08)
    _take(out, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, 0.09)
    assert out.text == "Hi there" and out.server_steps == [] and out.ttft_s == 0.05
    assert out.itl_s == [pytest.approx(0.03)] and out.completion_tokens == 2 and out.finish_reason == "length"
    with pytest.raises(EngineError, match="engine process"):
        _take(out, {"error": {"message": "the engine process for chef stopped"}}, 0.1)


def test_the_page_orders_and_shows_both_kinds_of_numbers(monkeypatch):
    from streamlit.testing.v1 import AppTest

    with kitchen() as (url, _):
        use_settings(monkeypatch, backend=url)
        page = AppTest.from_file(str(REPO / "kitchen_viz" / "web" / "pages" / "class_order.py"), default_timeout=120)
        page.run()
        assert not page.exception and page.selectbox(key="order-model").value == "chef"
        page.button(key="order-go").click().run()
        assert not page.exception
        labels = {m.label for m in page.metric}
        assert {"TTFT", "TPOT", "Tokens/s"} <= labels
        assert any("Measured by the kitchen" in h.value for h in page.subheader)
        assert any("The whole class" in h.value for h in page.subheader)  # a Two-Pot kitchen keeps a board
        assert {"Your TTFT", "Kitchen's TTFT", "Kitchen's TPOT"} <= labels
        assert any("How sure the chef was of each token" in h.value for h in page.subheader)
        assert any('title="p = ' in m.value for m in page.markdown)  # every token coloured by its probability
        assert any("The rail is empty" in m.value for m in page.markdown)  # the order is done: nothing on the rail
        page.text_area(key="order-prompt").set_value("   ").run()
        page.button(key="order-go").click().run()
        assert any("The order is empty" in e.value for e in page.error)
    page.run()
    assert any("could not list the models" in e.value for e in page.error)


def test_the_launcher_takes_a_backend_url(monkeypatch, capsys):
    code, _, err = launched(["--backend", "not-a-url"], capsys)
    assert code == 2 and "--backend must be a URL" in err
    s = launched(["--backend", "http://127.0.0.1:9000/v1", "--api-key", "k"], capsys)[1]
    assert s.backend == "http://127.0.0.1:9000" and s.backend_key == "k"
