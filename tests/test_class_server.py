"""The class kitchen server on the real engine (the chef), through the official `openai` client
and raw HTTP, on 127.0.0.1 only. Load tests are bounded in count and time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import pytest
from conftest import CHEF_CONTEXT
from kitchen_server import kitchen, serve
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from serving.caps import Caps
from serving.clients.loadgen import run_load

KEY = "class-key-123"


@pytest.fixture(scope="module")
def served():
    with kitchen(Caps(max_order_tokens=2000, max_new_tokens=200, max_order_seconds=60), KEY) as (url, client):
        yield url, client


@pytest.fixture
def oai(served):
    from openai import OpenAI

    return OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def alone(prompt, max_tokens: int) -> str:
    """The same prompt served alone by the engine itself (no server, no neighbours)."""
    from engine import Engine

    return Engine.load("chef").generate([prompt], max_new_tokens=max_tokens).texts[0]


def gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith(f"twopot:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def test_models_lists_the_catalog_name_only(oai):
    assert [m.id for m in oai.models.list().data] == ["chef"]


def test_completion_whole_and_streamed_equal_the_engine_alone(oai):
    expected = alone("ROMEO:", 24)
    whole = oai.completions.create(model="chef", prompt="ROMEO:", max_tokens=24, temperature=0)
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 24 and whole.usage.prompt_tokens > 0
    pieces, usage, timings = [], None, []
    for ch in oai.completions.create(model="chef", prompt="ROMEO:", max_tokens=24, temperature=0, stream=True,
                                     stream_options={"include_usage": True}):  # fmt: skip
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            pieces.append(c.text)
        if getattr(ch, "timings", None):
            timings.append(ch.timings)
    assert "".join(pieces) == expected
    assert usage.completion_tokens == 24 and usage.total_tokens == usage.prompt_tokens + 24
    phases = {t.get("phase") for t in timings}
    assert "decode" in phases and all(t["ttft_ms"] > 0 for t in timings)
    assert all(t["step_ms"] > 0 and t["kv_bytes"] > 0 for t in timings if "step_ms" in t)


def test_token_id_prompt_and_chat(oai):
    from engine import Engine

    ids = Engine.load("chef").encode("JULIET:")
    by_ids = oai.completions.create(model="chef", prompt=ids, max_tokens=10, temperature=0)
    assert by_ids.choices[0].text == alone(ids, 10)
    chat = oai.chat.completions.create(model="chef", messages=[{"role": "user", "content": "Who is there?"}],
                                       max_tokens=12, temperature=0)  # fmt: skip
    assert chat.choices[0].message.content == alone("USER:\nWho is there?\n\nASSISTANT:\n", 12)
    chunks = [c for c in oai.chat.completions.create(model="chef", messages=[{"role": "user", "content": "Who is there?"}],
                                                     max_tokens=12, temperature=0, stream=True) if c.choices]  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert [c.choices[0].delta.role for c in chunks] == ["assistant"] + [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert streamed == chat.choices[0].message.content


def test_tables_seeds_and_stop(oai):
    two = oai.completions.create(model="chef", prompt="KING:", max_tokens=12, temperature=0.9, seed=5, n=2)
    again = oai.completions.create(model="chef", prompt="KING:", max_tokens=12, temperature=0.9, seed=5, n=2)
    assert [c.text for c in two.choices] == [c.text for c in again.choices]  # seeded: repeatable
    assert [c.index for c in two.choices] == [0, 1]
    full = alone("ROMEO:", 30)
    stop = full[5:9]
    cut = oai.completions.create(model="chef", prompt="ROMEO:", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        ({"model": "gpt-4", "prompt": "hi"}, 404, "model 'gpt-4' is not served here"),
        ({"model": "/work/main/engine/models/chef", "prompt": "hi"}, 404, "is not served here"),
        ({"model": "chef", "prompt": "hi", "max_tokens": -5}, 422, "field 'max_tokens' must be an integer >= 1"),
        ({"model": "chef", "prompt": "hi", "max_tokens": 10**6}, 400, "instructor's limit is 200 new tokens"),
        ({"model": "chef", "prompt": "x " * (CHEF_CONTEXT + 100), "max_tokens": 5}, 400, "the model's context is"),
        ({"model": "chef", "prompt": [7] * (CHEF_CONTEXT - 100), "max_tokens": 150}, 400, "exceeds the model's context of"),
        ({"model": "chef"}, 422, "field 'prompt' is required"),
        ({"prompt": "hi", "max_tokens": 0}, 422, "field 'max_tokens' must be an integer >= 1"),
        ({"model": "chef", "prompt": "hi", "temperature": "hot"}, 422, "field 'temperature'"),
        ({"model": "chef", "prompt": [1, "a"]}, 422, "field 'prompt' must be text or a list of token ids"),
        ({"model": "chef", "prompt": [1, 5000]}, 400, "token id 5000"),
        ({"model": "chef", "prompt": "hi", "n": 99}, 422, "field 'n' must be an integer from 1 to 16"),
        ({"model": "chef", "prompt": {"text": "hi"}}, 422, "field 'prompt' must be text or a list of token ids"),
    ],
)
def test_bad_requests_get_one_line_json_errors(served, body, status, words):
    url = served[0]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + "/v1/completions", content=data, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and "\n" not in err["message"] and "Traceback" not in r.text


def test_wrong_key_big_body_and_caps_on_prompt_tokens(served):
    url = served[0]
    r = httpx.post(url + "/v1/completions", json={"model": "chef", "prompt": "hi"}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    assert httpx.post(url + "/v1/completions", json={"model": "chef", "prompt": "hi"}).status_code == 401
    big = b'{"model": "chef", "prompt": "' + b"a" * (2 << 20) + b'"}'
    r = httpx.post(url + "/v1/completions", content=big, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 413 and "the limit is 1,048,576 bytes" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "chef", "prompt": list(range(300)), "max_tokens": 5, "n": 8})  # fmt: skip
    assert r.status_code == 400 and "2,000 tokens per order" in r.json()["error"]["message"]
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_clients_that_hang_up_leave_nothing_running(served):
    url, client = served
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "chef", "prompt": "ROMEO:", "max_tokens": 200, "temperature": 0, "stream": True}

    def hang_up():
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    return  # one token, then gone

    threads = [threading.Thread(target=hang_up) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    deadline = time.time() + 30
    while gauge(url, "num_requests_running") > 0 or client.in_flight:
        assert time.time() < deadline, "cancelled streams are still running"
        time.sleep(0.1)
    text = httpx.get(url + "/metrics").text
    assert 'twopot:request_success_total{finished_reason="cancelled",model_name="chef"}' in text


def test_metrics_have_vllms_names_and_millisecond_buckets(served, oai):
    oai.completions.create(model="chef", prompt="ROMEO:", max_tokens=4, temperature=0)
    text = httpx.get(served[0] + "/metrics").text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "request_time_per_output_token_seconds",
                 "e2e_request_latency_seconds", "request_queue_time_seconds", "num_requests_running",
                 "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total", "generation_tokens_total",
                 "step_seconds"):  # fmt: skip
        assert f"twopot:{name}" in text, name
    assert 'twopot:inter_token_latency_seconds_bucket{le="0.0005",model_name="chef"}' in text
    assert 'twopot:inter_token_latency_seconds_bucket{le="0.003",model_name="chef"}' in text


def test_an_order_past_its_time_is_cancelled_with_one_line():
    """Both orders must outlast the limit on any machine: the chef's native step cooks 400 tokens in
    about 0.2 s here, so the orders run the torch forward (about 1.5 s) against a 0.1 s limit."""
    with kitchen(Caps(max_order_seconds=0.1), api_key=None, native=False) as (url, client):
        body = {"model": "chef", "prompt": "ROMEO:", "max_tokens": 500 - 10, "temperature": 0, "stream": True}
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
        assert "error" in events[-1] and "cancelled after 0.1 s" in events[-1]["error"]["message"]
        r = httpx.post(url + "/v1/completions", json={**body, "stream": False, "max_tokens": 400})
        assert r.status_code == 408 and "instructor's limit per order is 0.1 s" in r.json()["error"]["message"]
        deadline = time.time() + 20
        while client.in_flight:
            assert time.time() < deadline
            time.sleep(0.05)


def test_a_killed_engine_comes_back_and_the_stream_goes_on():
    """Without batch invariance the resumed tokens are the model's greedy answer to the same text,
    not always the same bits (serving/host/recovery.py); tests/test_recovery.py holds the bits."""
    with kitchen(api_key=None) as (url, client):
        body = {"model": "chef", "prompt": "ROMEO:", "max_tokens": 400, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        old = client.pid
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 3:
                        os.kill(old, signal.SIGKILL)
        assert not any("error" in e for e in events) and events[-1]["usage"]["completion_tokens"] == 400
        r = httpx.post(url + "/v1/completions", json={**body, "stream": False, "max_tokens": 8}, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == alone("ROMEO:", 8)
        assert client.pid != old and httpx.get(url + "/health").json()["restarts"] == 1


def test_loadgen_a_small_class_gets_every_answer_it_would_get_alone(capsys):
    from serving.clients.loadgen import main as loadgen

    with kitchen(api_key=None) as (url, _):
        code = loadgen(["--url", url, "--students", "8", "--requests", "16", "--rate", "50", "--max-tokens", "12",
                        "--prompt-len", "uniform:3:30", "--verify", "--json", "--timeout", "120"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["errors"] == 0 and report["mismatches"] == 0 and report["requests"] == 16
    assert 0 < report["ttft_s"]["p50"] <= report["ttft_s"]["p99"] and report["itl_s"]["p99"] > 0


def test_loadgen_names_a_stream_that_never_ends_instead_of_hanging():
    """A server that sends one chunk and then nothing: past the load's bound the request is an error
    that says so, and the answered ones keep their answers."""
    async def completions(request):
        body = await request.json()

        async def chunks():
            yield 'data: {"choices": [{"text": "Ay"}]}\n\n'
            if body["prompt"] == "stall":
                await asyncio.sleep(3600)
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    with serve(Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])) as url:
        outs = asyncio.run(run_load(url, "chef", ["ok", "stall"], [0.0, 0.0], 2, 4, None, 2.0))
    assert outs[0].error is None and outs[0].done is not None and outs[0].text == "Ay"
    assert outs[1].done is None
    assert outs[1].error == "no whole answer within the load's bound of 2 s (1 chunks had arrived)"


def test_loadgen_refuses_anything_but_loopback(capsys):
    from serving.clients.loadgen import main as loadgen

    assert loadgen(["--url", "http://10.0.0.5:8000"]) == 2
    assert "--url must be a loopback address" in capsys.readouterr().err


def test_a_shared_house_prompt_is_cooked_once(oai, served):
    house = "KING HENRY:\nOnce more unto the breach, dear friends, once more;\nOr close the wall up with our English dead.\n\n"
    first = oai.completions.create(model="chef", prompt=house + "ROMEO:", max_tokens=6, temperature=0)
    second = oai.completions.create(model="chef", prompt=house + "JULIET:", max_tokens=6, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens < 5  # at most a word shared with earlier orders
    assert second.usage.prompt_tokens_details.cached_tokens >= 20  # the house prompt, reused
    assert second.choices[0].text == alone(house + "JULIET:", 6)
    text = httpx.get(served[0] + "/metrics").text
    hits = next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("twopot:prefix_cache_hits_total{"))
    assert hits >= 20
