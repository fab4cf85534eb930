"""The Lab on a kitchen server: settings and results as JSON, a sweep run in the server's own engine
process by key and followed by the app's client (serving/host/wire.py, lab/sweeps.py)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
import pytest
from kitchen_server import kitchen

from engine import Engine
from lab.cache import ResultCache
from lab.experiment import default_settings
from lab.padding import PaddingSettings
from lab.progress import Progress
from lab.registry import EXPERIMENTS, LabRun
from serving.host.wire import from_json as decode
from serving.host.wire import to_json as encode
from serving.host_client import HostClient

KEY = "lab-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served():
    with kitchen(api_key=KEY) as (url, client):
        yield url, client


@pytest.fixture(scope="module")
def chef_info():
    return Engine.load("chef").info


def test_every_experiments_default_settings_travel_as_json(chef_info):
    for exp in EXPERIMENTS:
        s = default_settings(exp, chef_info)
        sent = json.dumps(encode(s))
        assert decode(json.loads(sent)) == s, exp.key


def test_only_registered_dataclasses_are_rebuilt():
    for bad in ({"__t": "os:system"}, {"__t": "dict"}, {"__t": "lab.padding:os.system"},
                {"__t": "NoSuchThing"}):  # fmt: skip
        with pytest.raises(ValueError):
            decode(bad)
    assert decode({"plain": "object"}) == {"plain": "object"}
    with pytest.raises(TypeError, match="cannot travel"):
        encode(object())

    @dataclass
    class Elsewhere:  # defined in a test, never registered
        x: int

    with pytest.raises(TypeError, match="not a registered type"):
        encode(Elsewhere(1))
    assert decode(encode({"a": (1, 2.5, None), 3: [True]})) == {"a": (1, 2.5, None), 3: [True]}


def test_a_sweep_runs_on_the_server_and_the_app_keeps_its_result(served, tmp_path):
    url, _ = served
    svc = HostClient(url, "chef", api_key=KEY)
    assert svc.wait_ready(60)
    cache = ResultCache(tmp_path)
    kept = []

    def keep(result):
        kept.append(result)
        return cache.put("padding-test", result)

    settings = PaddingSettings(lengths=(8, 24), repeats=1)
    job = svc.submit(LabRun("padding", settings, keep), label="lab: padding")
    assert job.wait(180) and job.status == "done", job.error
    assert job.result.key == "padding-test" and cache.get("padding-test").result == kept[0]
    result = kept[0]
    assert type(result).__name__ == "PaddingResult" and result.settings == settings
    assert {p.mode for p in result.points} == {"padded", "packed"} and result.same_tokens
    assert result.sample.trace.steps and result.sample.metrics.ttft_s > 0  # a real run, measured there
    assert job.events and all(isinstance(e, Progress) for e in job.events)
    assert job.events[-1].done == job.events[-1].total
    svc.close()


def test_bad_lab_requests_are_one_line_each(served):
    url, _ = served
    post = lambda path, body: httpx.post(url + path, json=body, headers=AUTH, timeout=30)  # noqa: E731
    r = post("/kitchen/lab/nope", {"settings": encode(PaddingSettings())})
    assert r.status_code == 404 and r.json()["error"]["message"].startswith("no lab experiment 'nope'")
    r = post("/kitchen/lab/padding", {})
    assert r.status_code == 422 and r.json()["error"]["param"] == "settings"
    r = post("/kitchen/lab/padding", {"settings": {"__t": "os:system"}})
    assert r.status_code == 422 and "not a type this side knows" in r.json()["error"]["message"]
    from lab.tables import TablesSettings

    r = post("/kitchen/lab/padding", {"settings": encode(TablesSettings())})
    assert r.status_code == 422 and "settings of experiment 'padding'" in r.json()["error"]["message"]
    r = httpx.post(url + "/kitchen/lab/padding", json={"settings": encode(PaddingSettings())}, timeout=30)
    assert r.status_code == 401
    r = post("/kitchen/lab/padding", {"settings": encode(PaddingSettings(lengths=(8,)))})  # refused by the sweep
    assert r.status_code == 200
    lines = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    assert "at least 2 prompts" in lines[-1]["error"]["message"]


def test_a_client_that_hangs_up_cancels_its_sweep(served):
    url, _ = served
    svc = HostClient(url, "chef", api_key=KEY)
    assert svc.wait_ready(60)
    job = svc.submit(LabRun("padding", PaddingSettings(lengths=(8, 64, 128, 256), repeats=5)), label="lab")
    deadline = time.monotonic() + 120
    while not job.events and time.monotonic() < deadline:  # it has started on the server
        time.sleep(0.05)
    assert job.cancel("cancelled: you pressed Cancel")
    assert job.wait(30) and job.status == "cancelled"
    client = served[1]  # the kitchen's engine process: the sweep ran in its loop
    deadline = time.monotonic() + 30
    while client.in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.in_flight == 0 and client.restarts == 0  # the sweep stopped on the server too, the loop lives
    svc.close()
