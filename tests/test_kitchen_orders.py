"""The Kitchen's orders on a real class kitchen server (serving/http/order_routes.py), the app's client
for them (serving/host_client.py) and the app's kitchen rooms (serving/http/mounted.py), on 127.0.0.1
only. One chef server for the module; every wait has a deadline."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from conftest import CHEF_CONTEXT, use_settings
from kitchen_server import kitchen, serve

from engine.errors import EngineError
from engine.events import Done, PrefillEnd, PrefillStart, StepEnd, Token
from kitchen_viz.orders import Order
from serving.caps import Caps
from serving.host.api import OrderForm
from serving.host.wire import from_json
from serving.host_client import HostClient

KEY = "kitchen-key-7"
AUTH = {"Authorization": f"Bearer {KEY}"}
CAPS = Caps(max_order_tokens=2000, max_new_tokens=480, max_order_seconds=60)


@pytest.fixture(scope="module")
def served():
    with kitchen(CAPS, KEY) as (url, client):
        yield url, client


@pytest.fixture(scope="module")
def ref():
    """The chef alone: the answers every order must get."""
    from engine import Engine

    return Engine.load("chef")


@pytest.fixture(scope="module")
def svc(served):
    kitchen_ = HostClient(served[0], "chef", api_key=KEY)
    assert kitchen_.wait_ready(60)
    yield kitchen_
    kitchen_.close()


def until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def nothing_running(client) -> bool:
    return client.in_flight == 0 and client.state.running == 0 and client.state.waiting == 0


def read_order(r: httpx.Response, on_event=None) -> tuple[dict, list, list[str]]:
    """(the first message, the order's events, every data line) of a /kitchen/orders stream."""
    first, events, lines = None, [], []
    for line in r.iter_lines():
        if not line.startswith("data: "):
            continue
        lines.append(line[6:])
        if line == "data: [DONE]":
            continue
        msg = json.loads(line[6:])
        if first is None:
            first = msg
            continue
        assert set(msg) == {"events"} and msg["events"], msg  # one message per step: its events together
        for d in msg["events"]:
            events.append(from_json(d))
            if on_event is not None and on_event(events[-1]) is False:
                return first, events, lines
    return first, events, lines


def order(url: str, prompts: list, max_new: int, **extra) -> tuple[dict, list, list[str]]:
    body = {"model": "chef", "prompts": prompts, "max_new_tokens": max_new, "temperature": 0} | extra
    with httpx.stream("POST", url + "/kitchen/orders", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return read_order(r)


def result_of(events: list):
    assert isinstance(events[-1], Done) and sum(isinstance(e, Done) for e in events) == 1
    return events[-1].result


def board(url: str, order_id: str | None = None) -> dict:
    params = {"order": order_id} if order_id else {}
    r = httpx.get(url + "/kitchen/board", params=params, headers=AUTH, timeout=10)
    assert r.status_code == 200
    return r.json()


# -- orders over HTTP ----------------------------------------------------------------------------------------------


def test_an_order_streamed_equals_generate_and_shows_on_the_board(served, ref):
    url, client = served
    prompts = ["ROMEO:\n", "JULIET:\n", ref.encode("KING:")]  # text and token ids
    expected = ref.generate(prompts, max_new_tokens=12)
    first, events, lines = order(url, prompts, 12)
    assert first["order"].startswith("order-") and first["prompt_tokens"] == [len(p) for p in expected.prompt_ids]
    assert lines[-1] == "[DONE]" and lines.count("[DONE]") == 1
    res = result_of(events)
    assert res.tokens == expected.tokens and res.texts == expected.texts and res.path == "class kitchen"
    assert res.model == "chef" and res.metrics.ttft_s > 0 and res.metrics.tpot_s > 0
    assert isinstance(events[0], PrefillStart) and isinstance(events[1], PrefillEnd)
    for i in range(3):
        assert [e.token_id for e in events if isinstance(e, Token) and e.seq == i] == res.tokens[i]
    assert [e.step for e in events if isinstance(e, StepEnd)] == res.trace.steps
    # the board counts the order's steps as its own: 3 tables in each of 12 passes, and no one else's
    snap = board(url, first["order"])
    mine = [s for s in snap["steps"] if s["mine"]]
    assert sum(s["mine"] for s in mine) == 3 * 12 and max(s["mine"] for s in mine) == 3
    assert snap["tickets"] == [] and snap["in_kitchen"] == 0  # done: its tickets left the rail
    assert all(s["mine"] == 0 for s in board(url)["steps"])  # without the order's id, nothing is anyone's
    assert first["order"] not in json.dumps(snap) and "ROMEO" not in json.dumps(snap)
    until(lambda: nothing_running(client), "the finished order is still in flight")


def test_a_seeded_sampled_order_is_the_same_twice(served):
    url, _ = served
    a = result_of(order(url, ["ROMEO:"] * 2, 10, temperature=0.9, seed=5)[1])
    b = result_of(order(url, ["ROMEO:"] * 2, 10, temperature=0.9, seed=5)[1])
    c = result_of(order(url, ["ROMEO:"] * 2, 10, temperature=0.9, seed=6)[1])
    assert a.tokens == b.tokens and a.tokens != c.tokens
    assert a.tokens[0] != a.tokens[1]  # table i samples with seed + i: same prompt, its own draw
    assert a.settings["temperature"] == 0.9 and a.settings["seed"] == 5


def test_two_orders_at_once_share_the_batch_and_equal_their_answers_alone(served, ref):
    url, _ = served
    mains = ["ROMEO:\nO she doth", "JULIET:\n"]
    guests = [[5, 17, 300, 41], "KING:\nWhat news", "QUEEN:"]
    # the first order is long enough that the second arrives while it cooks (a native step is ~1 ms)
    expected = {"a": ref.generate(mains, max_new_tokens=400).tokens, "b": ref.generate(guests, max_new_tokens=8).tokens}
    results, errors = {}, []
    second = threading.Thread(target=lambda: run("b", guests, 8))

    def run(name: str, prompts: list, max_new: int, on_event=None) -> None:
        body = {"model": "chef", "prompts": prompts, "max_new_tokens": max_new, "temperature": 0}
        try:
            with httpx.stream("POST", url + "/kitchen/orders", json=body, headers=AUTH, timeout=60) as r:
                results[name] = result_of(read_order(r, on_event)[1])
        except Exception as err:  # noqa: BLE001 -- reported by the main thread
            errors.append(err)

    def start_second(ev) -> None:  # the first order is cooking: a second student orders
        if isinstance(ev, StepEnd) and not second.is_alive() and second.ident is None:
            second.start()

    first = threading.Thread(target=run, args=("a", mains, 400, start_second))
    first.start()
    first.join(120)
    second.join(120)
    assert not errors and set(results) == {"a", "b"}
    assert results["a"].tokens == expected["a"] and results["b"].tokens == expected["b"]
    # the pot held both orders' tables at once: some of the first order's passes had 5 tables in them
    assert max(s.batch for s in results["a"].trace.steps) == 5
    assert max(s.batch for s in results["b"].trace.steps) == 5


def test_the_board_marks_the_orders_tables_while_it_cooks_and_a_hang_up_cancels_it(served):
    url, client = served
    before = cancelled_count(url)
    body = {"model": "chef", "prompts": ["ROMEO:", "JULIET:"], "max_new_tokens": 480, "temperature": 0}
    snaps, seen = [], []
    with httpx.stream("POST", url + "/kitchen/orders", json=body, headers=AUTH, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                msg = json.loads(line[6:])
                seen += msg["events"] if "events" in msg else [msg]
                if len(seen) == 1:
                    continue
                if any(m.get("__t") == "Token" for m in seen[1:]):
                    snaps.append(board(url, seen[0]["order"]))
                    break  # then hang up, mid-order
    assert all(m.get("__t") != "Done" for m in seen)
    mine = [t for t in snaps[0]["tickets"] if t["mine"]]
    assert len(mine) == 2 and {t["state"] for t in mine} == {"running"}
    assert all(t["prompt_tokens"] > 0 for t in mine)
    until(lambda: nothing_running(client), "a hung-up order is still cooking")
    until(lambda: cancelled_count(url) == before + 2, "the order's two tables were not cancelled")
    assert board(url)["in_kitchen"] == 0


def cancelled_count(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    name = 'twopot:request_success_total{finished_reason="cancelled",model_name="chef"}'
    line = next((ln for ln in text.splitlines() if ln.startswith(name)), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


# -- refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"model": "gpt-4", "prompts": ["hi"]}, 404, "model 'gpt-4' is not served here"),
        ({"model": "/work/main/engine/models/chef", "prompts": ["hi"]}, 404, "is not served here"),
        ({"prompts": ["hi"]}, 422, "field 'model' is required"),
        ({"model": "chef"}, 422, "field 'prompts' is required"),
        ({"model": "chef", "prompts": "hi"}, 422, "field 'prompts' must be a list of 1 to 64 prompts"),
        ({"model": "chef", "prompts": []}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": ["hi"] * 65}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": ["hi", ""]}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": ["  \n"]}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": [[]]}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": [[1, "a"]]}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": [[1, True]]}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": [{"text": "hi"}]}, 422, "field 'prompts'"),
        ({"model": "chef", "prompts": ["hi"], "max_new_tokens": 0}, 422, "field 'max_new_tokens' must be an integer >= 1"),
        ({"model": "chef", "prompts": ["hi"], "max_new_tokens": "8"}, 422, "field 'max_new_tokens'"),
        ({"model": "chef", "prompts": ["hi"], "max_new_tokens": True}, 422, "field 'max_new_tokens'"),
        ({"model": "chef", "prompts": ["hi"], "temperature": 3}, 422, "field 'temperature'"),
        ({"model": "chef", "prompts": ["hi"], "seed": 1.5}, 422, "field 'seed'"),
        ({"model": "chef", "prompts": ["hi", [7] * (CHEF_CONTEXT - 200)], "max_new_tokens": 250}, 400,
         "exceeds the model's context of"),
        ({"model": "chef", "prompts": [[1, 5000]]}, 400, "token id 5000"),
        ({"model": "chef", "prompts": ["hi"], "max_new_tokens": 481}, 400, "instructor's limit is 480 new tokens"),
        ({"model": "chef", "prompts": [list(range(1, 450))] * 5, "max_new_tokens": 4}, 400,
         "limit is 2,000 tokens per order"),
        (["not", "an", "object"], 422, "the body must be a JSON object"),
        (b"{not json", 400, "not valid JSON"),
    ],
)  # fmt: skip
def test_bad_orders_get_one_json_line_and_leave_nothing_running(served, body, status, words):
    url, client = served
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + "/kitchen/orders", content=data, headers=AUTH | {"content-type": "application/json"},
                   timeout=30)  # fmt: skip
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and "\n" not in err["message"] and "Traceback" not in r.text
    assert err["code"] == status
    if status == 422 and "field '" in words:
        assert err["param"] == words.split("'")[1]
    until(lambda: nothing_running(client), "a refused order left something in the kitchen")


def test_keys_and_body_size(served):
    url, _ = served
    body = {"model": "chef", "prompts": ["hi"], "max_new_tokens": 2}
    for path in ("/kitchen/orders", "/kitchen/check", "/kitchen/limits"):
        for headers in ({"Authorization": "Bearer nope"}, {}):
            r = httpx.post(url + path, json=body, headers=headers, timeout=10)
            assert r.status_code == 401 and "API key" in r.json()["error"]["message"], path
    r = httpx.get(url + "/kitchen/model", timeout=10)
    assert r.status_code == 401
    big = b'{"model": "chef", "prompts": ["' + b"a" * (2 << 20) + b'"]}'
    r = httpx.post(url + "/kitchen/orders", content=big, headers=AUTH, timeout=30)
    assert r.status_code == 413 and "the limit is 1,048,576 bytes" in r.json()["error"]["message"]


def test_model_limits_and_check_answer_the_order_form(served, ref):
    url, client = served
    about = httpx.get(url + "/kitchen/model", headers=AUTH, timeout=10).json()
    assert about["name"] == "chef" and about["policy"] == "chunked" and about["token_budget"] == 64
    assert about["pid"] == client.pid and about["threads"] == 1
    info = about["info"]
    assert info["name"] == "chef" and info["max_context"] == ref.info.max_context == CHEF_CONTEXT
    assert info["kv_bytes_per_token"] == ref.info.kv_bytes_per_token and info["has_tokenizer"] is True
    per, seats, kv_tokens = info["kv_bytes_per_token"], about["seats"], about["kv_tokens"]

    lim = httpx.post(url + "/kitchen/limits", json={"prompt_tokens": 100, "max_new_tokens": 64}, headers=AUTH).json()
    assert lim["max_batch"] == min(seats, kv_tokens // 164) and 164 <= lim["max_context"] <= info["max_context"]
    assert lim["kv_bytes_per_token"] == per and lim["kv_bytes_per_sequence"] == 164 * per
    assert lim["kv_budget_bytes"] == kv_tokens * per
    r = httpx.post(url + "/kitchen/limits", json={"prompt_tokens": 0}, headers=AUTH)
    assert r.status_code == 422 and "field 'prompt_tokens'" in r.json()["error"]["message"]

    r = httpx.post(url + "/kitchen/check", json={"prompts": ["ROMEO:", [1, 2, 3]], "max_new_tokens": 8}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"prompt_ids": [ref.encode("ROMEO:"), [1, 2, 3]]}
    r = httpx.post(url + "/kitchen/check", json={"prompts": [[7] * CHEF_CONTEXT], "max_new_tokens": 8}, headers=AUTH)
    assert r.status_code == 400
    err = r.json()["error"]
    assert "exceeds the model's context of" in err["message"] and err["param"] == "prompts"
    r = httpx.post(url + "/kitchen/check", json={"prompts": []}, headers=AUTH)
    assert r.status_code == 422
    until(lambda: client.in_flight == 0, "the order form's questions stayed in flight")  # refused ones too


# -- the app's client: HostClient ---------------------------------------------------------------------------------


def test_server_kitchen_cooks_an_order_as_generate_would(svc, served, ref):
    assert svc.state == "ready" and svc.load_error is None and svc.info.name == "chef"
    assert svc.engine_pid == served[1].pid and svc.info.kv_bytes_per_token == ref.info.kv_bytes_per_token
    lim = svc.limits(100, 64)
    assert lim.max_context == svc.limits(1, 1).max_context <= CHEF_CONTEXT and lim.kv_bytes_per_sequence == 164 * lim.kv_bytes_per_token
    o = Order(batch=3, max_new_tokens=10, temperature=0.0, seed=0, prompt_tokens=20)
    checked = svc.check(o.form())
    ids = checked.prompt_ids
    assert [len(p) for p in ids] == [20, 20, 20]
    assert svc.check(OrderForm(["ROMEO:"], 1)).prompt_ids == [ref.encode("ROMEO:")]
    job = svc.submit(checked, o.label, hold=True)
    assert job.status == "queued"
    job.release(0.05)
    assert job.wait(60) and job.status == "done" and job.error is None
    assert job.result.path == "class kitchen" and job.result.tokens == ref.generate(ids, max_new_tokens=10).tokens
    assert job.order_id.startswith("order-") and isinstance(job.events[0], PrefillStart)
    assert job.events[-1].result is job.result and job.started_at <= job.finished_at
    assert svc.queue_length() == 0 and job.place_in_line() == 0

    text = Order(batch=2, max_new_tokens=6, temperature=0.0, seed=0, text="JULIET:")
    job = svc.submit(svc.check(text.form()), text.label)
    assert job.wait(60) and job.status == "done"
    assert job.result.tokens == ref.generate(["JULIET:"] * 2, max_new_tokens=6).tokens


def test_the_run_log_counts_the_orders_tables_not_the_busy_pot(served, ref):
    """The Dashboard's rows: a class kitchen's passes also hold other students' tables, but an order's
    row counts its own tables and prompt tokens."""
    from lab.runlog import RunLog

    log = RunLog()
    mine = HostClient(served[0], "chef", api_key=KEY, run_log=log)
    assert mine.wait_ready(60)
    busy = threading.Thread(target=order, args=(served[0], ["KING:", "QUEEN:", "DUKE:"], 300))
    busy.start()
    until(lambda: served[1].state.running >= 3, "the other student's order never started")
    o = Order(batch=2, max_new_tokens=8, temperature=0.0, seed=0, prompt_tokens=12)
    job = mine.submit(mine.check(o.form()), o.label)
    assert job.wait(60) and job.status == "done"
    busy.join(60)
    mine.close()
    assert job.result.trace.prefill.batch > 2  # the wok's pass also held the other order's decodes
    row = log.frame().iloc[0]
    assert row["batch"] == 2 and row["prompt_tokens"] == 24 and row["output_tokens"] == 16


def test_server_kitchen_cancel_leaves_nothing_running(svc, served):
    client = served[1]
    long = Order(batch=2, max_new_tokens=480, temperature=0.0, seed=0, prompt_tokens=20)
    job = svc.submit(svc.check(long.form()), long.label)
    until(lambda: any(isinstance(e, Token) for e in job.events), "the order never started cooking")
    assert job.cancel("cancelled: you pressed Cancel")
    assert job.wait(10) and job.status == "cancelled" and job.error == "cancelled: you pressed Cancel"
    assert job.result is None and not job.cancel("again")  # a finished job is not cancelled twice
    assert not any(isinstance(e, Done) for e in job.events)
    until(lambda: nothing_running(client), "a cancelled order is still cooking on the server")

    held = svc.submit(svc.check(long.form()), long.label, hold=True)  # cancelled before its page released it
    assert held.cancel("gone") and held.wait(10) and held.status == "cancelled" and held.error == "gone"
    assert held.events == [] and held.order_id is None


def test_server_kitchen_refusals_are_one_line(svc):
    with pytest.raises(EngineError) as err:
        svc.check(OrderForm([[7] * CHEF_CONTEXT], 8))
    assert str(err.value).startswith("HTTP 400: ") and "context of" in str(err.value)
    with pytest.raises(EngineError, match="instructor's limit is 480 new tokens") as err:  # the host's caps, at the check
        svc.check(Order(batch=1, max_new_tokens=481, temperature=0.0, seed=0, text="hi").form())
    assert str(err.value).startswith("HTTP 400: ")
    with pytest.raises(EngineError, match="the Lab's runs .* not other code"):
        svc.submit(lambda engine, emit: None, "code the server would have to run")


def test_server_kitchen_for_a_model_or_key_the_server_does_not_have(served):
    url = served[0]
    other = HostClient(url, "apprentice", api_key=KEY)
    keyless = HostClient(url, "chef")
    try:
        assert other.wait_ready(30) and keyless.wait_ready(30)
        assert other.state == "error" and other.info is None
        assert "did not serve apprentice" in other.load_error and "it serves 'chef' only" in other.load_error
        assert keyless.state == "error" and "HTTP 401" in keyless.load_error and "API key" in keyless.load_error
        for k in (other, keyless):
            assert "\n" not in k.load_error
            with pytest.raises(EngineError, match="did not serve"):
                k.limits(10, 10)
        with pytest.raises(EngineError) as err:
            other.check(Order(batch=1, max_new_tokens=4, temperature=0.0, seed=0, text="hi").form())
        assert str(err.value) == other.load_error
    finally:
        other.close()
        keyless.close()


def test_server_kitchen_close_cancels_its_orders_and_refuses_more(served):
    k = HostClient(served[0], "chef", api_key=KEY)
    assert k.wait_ready(30)
    long = Order(batch=1, max_new_tokens=480, temperature=0.0, seed=0, prompt_tokens=20)
    job = k.submit(k.check(long.form()), long.label)
    until(lambda: bool(job.events), "the order never started cooking")
    k.close()
    assert job.wait(10) and job.status == "cancelled" and "closed" in job.error
    with pytest.raises(EngineError, match="closed"):
        k.submit(k.check(long.form()), long.label)
    until(lambda: nothing_running(served[1]), "a closed kitchen's order is still cooking on the server")


# -- servers that are not (quite) kitchen servers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def stand_in(served):
    """/bare: any web server (404 everywhere); /odd, /short, /boom: a kitchen whose order stream is
    malformed, ends without its result, or ends in an error event."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Mount, Route

    about = httpx.get(served[0] + "/kitchen/model", headers=AUTH, timeout=10).json()
    streams = {
        "odd": ['{"events": [{"__t": "Token", "t": 0.1}]}'],
        "short": [],
        "boom": ['{"error": {"message": "the pot boiled over", "code": 500}}'],
        "list": ["[1, 2]"],
    }

    def room(name: str) -> Mount:
        async def model(request):
            return JSONResponse(about)

        async def check(request):
            return JSONResponse({"prompt_ids": [[5, 6]]})

        async def orders(request):
            async def lines():
                yield 'data: {"order": "order-x", "prompt_tokens": [2]}\n\n'
                for line in streams[name]:
                    yield f"data: {line}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(lines(), media_type="text/event-stream")

        return Mount(f"/{name}", routes=[Route("/kitchen/model", model), Route("/kitchen/check", check, methods=["POST"]),
                                         Route("/kitchen/orders", orders, methods=["POST"])])  # fmt: skip

    with serve(Starlette(routes=[room(n) for n in streams])) as url:
        yield url


def test_a_server_without_kitchen_routes_is_an_error_at_once(stand_in):
    k = HostClient(stand_in + "/bare", "chef")
    try:
        assert k.wait_ready(10) and k.state == "error"
        assert "has no /kitchen/model" in k.load_error and "not a Two-Pot kitchen server" in k.load_error
        assert "\n" not in k.load_error and k.load_error.startswith(f"the kitchen server at {stand_in}/bare")
    finally:
        k.close()


@pytest.mark.parametrize(
    "room, words",
    [
        ("odd", "cannot read: a malformed Token"),
        ("list", "cannot read: an event must be a JSON object"),
        ("short", "ended the order without its result"),
        ("boom", "the pot boiled over"),
    ],
)
def test_a_broken_order_stream_ends_the_job_in_one_line(stand_in, room, words):
    k = HostClient(f"{stand_in}/{room}", "chef")
    try:
        assert k.wait_ready(10) and k.state == "ready"
        job = k.submit(k.check(Order(batch=1, max_new_tokens=4, temperature=0.0, seed=0, text="hi").form()), "x")
        assert job.wait(10), "the job never finished"
        assert job.status == "error" and words in job.error and "\n" not in job.error
        assert job.order_id == "order-x"
    finally:
        k.close()


# -- the app's kitchen rooms -----------------------------------------------------------------------------------------


def test_kitchen_rooms_open_catalog_models_only():
    from serving.http.mounted import HostRooms

    refusal = HostRooms.refusal
    assert refusal("chef", "cpu", "int8") is None and refusal("chef", "cuda:1", "bfloat16") is None
    lines = {
        ("nope", "cpu", "float32"): "no model 'nope' in this server's catalog (chef, apprentice",
        ("/work/main/engine/models/chef", "cpu", "float32"): "no model '/work/main/engine/models/chef'",
        ("../chef", "cpu", "float32"): "no model '../chef'",
        ("chef", "gpu", "float32"): "device must be cpu or cuda[:N] (got 'gpu')",
        ("chef", "cuda:x", "float32"): "device must be cpu or cuda[:N]",
        ("chef", "cpu", "fp8"): "precision must be one of float32, bfloat16, float16, int8 (got 'fp8')",
    }
    for key, words in lines.items():
        line = refusal(*key)
        assert line is not None and words in line and "\n" not in line, key


def test_kitchen_path_is_the_class_kitchen_only_for_its_own_choice(monkeypatch):
    from serving.http.mounted import kitchen_path

    use_settings(monkeypatch)
    assert kitchen_path("chef", "cpu", "float32") == "/kitchens/chef/cpu/float32"
    use_settings(monkeypatch, class_model="chef")
    assert kitchen_path("chef", "cpu", "float32") == "/class"
    assert kitchen_path("chef", "cpu", "int8") == "/kitchens/chef/cpu/int8"
    assert kitchen_path("chef", "cuda:0", "float32") == "/kitchens/chef/cuda%3A0/float32"
    assert kitchen_path("preset:smollm2-135m", "cpu", "float32") == "/kitchens/preset%3Asmollm2-135m/cpu/float32"
    assert kitchen_path("a/b", "cpu", "float32") == "/kitchens/a%2Fb/cpu/float32"
