"""The wok cooks what it shows: a Kitchen order on the class kitchen (whose prefix cache is on)
computes every prompt token unless the learner asked to reuse leftovers, and when it does reuse,
every view says how many tokens and counts only the computed ones in a rate.

A real chef server on 127.0.0.1 (tests/kitchen_server.py), the app's own client, the engine's events.
"""

from __future__ import annotations

import httpx
import pytest
from kitchen_server import kitchen

from engine.events import PrefillStart
from kitchen_viz.app_state import APP_DIR
from kitchen_viz.orders import Order
from kitchen_viz.panels import panel_values
from kitchen_viz.timeline import LiveRun
from lab.inspector import diagnose
from lab.runlog import RunLog
from serving.host_client import HostClient

PROMPT, TABLES, NEW = 40, 2, 4  # two tables of 40 prompt tokens: more than one 64-token pass


@pytest.fixture(scope="module")
def served():
    with kitchen() as (url, client):
        yield url, client


def cook_on(svc: HostClient, reuse: bool):
    order = Order(batch=TABLES, max_new_tokens=NEW, temperature=0.0, seed=0, prompt_tokens=PROMPT, reuse_prefix=reuse)
    job = svc.submit(svc.check(order.form()), order.label)
    assert job.wait(60) and job.status == "done", job.error
    run = LiveRun.for_order("t", [PROMPT] * TABLES)
    run.consume(job.events)
    return job, run


def first_prefill(job) -> PrefillStart:
    return next(e for e in job.events if isinstance(e, PrefillStart))


def test_the_same_order_twice_cooks_every_prompt_token_both_times(served):
    log = RunLog()
    svc = HostClient(served[0], "chef", run_log=log)
    assert svc.wait_ready(60)
    try:
        first, _ = cook_on(svc, reuse=False)
        again, run = cook_on(svc, reuse=False)  # its leftovers are in the cache: not used
    finally:
        svc.close()
    total = PROMPT * TABLES
    for job in (first, again):
        assert job.result.reused_tokens == 0
        assert first_prefill(job).slots == total  # the wok computes every prompt token it draws
        assert job.result.trace.prefill.tokens >= total  # (a mixed pass also carries a decode)
    assert run.reused == 0 and panel_values(run).reused == "" and run.scene_data()["reused_words"] == ""
    assert list(log.frame()["reused_tokens"]) == [0, 0]


def test_reuse_turned_on_takes_the_leftovers_and_every_view_says_how_many(served):
    log = RunLog()
    svc = HostClient(served[0], "chef", run_log=log)
    assert svc.wait_ready(60)
    try:
        cook_on(svc, reuse=False)  # the leftovers of this order stay in the cache
        job, run = cook_on(svc, reuse=True)
    finally:
        svc.close()
    total = PROMPT * TABLES
    reused = job.result.reused_tokens
    assert reused == (PROMPT - 1) * TABLES  # all but each prompt's last token (its logits give token 1)
    assert first_prefill(job).slots == total - reused
    words = f"{reused:,} of {total:,} prompt tokens reused"
    assert run.reused == reused and words in panel_values(run).reused
    data = run.scene_data()
    assert words in data["reused_words"] and data["wok_tokens"] == job.result.trace.prefill.tokens < total
    m = job.result.metrics
    assert m.prefill_tokens < total  # the wok's rate counts only what it computed
    assert data["wok_rate"] == f"{m.prefill_tps:,.0f} tok/s"  # the drawing's rate is the engine's
    verdict = diagnose(m, job.result.trace, reused=reused, prompt_tokens=total)
    assert words in verdict.headline
    assert list(log.frame()["reused_tokens"]) == [0, reused]


def test_the_reuse_field_takes_true_or_false_only(served):
    body = {"model": "chef", "prompts": ["ROMEO:"], "max_new_tokens": 2, "reuse_prefix": "yes"}
    r = httpx.post(served[0] + "/kitchen/orders", json=body, timeout=30)
    assert r.status_code == 422
    assert r.json()["error"]["message"].startswith("field 'reuse_prefix' must be true or false")


def test_the_dashboard_says_how_many_prompt_tokens_its_runs_reused(served):

    from streamlit.testing.v1 import AppTest

    from kitchen_viz.app_state import run_log
    from lab.registry import DASHBOARD

    svc = HostClient(served[0], "chef")
    assert svc.wait_ready(60)
    try:
        cook_on(svc, reuse=False)
        job, _ = cook_on(svc, reuse=True)
    finally:
        svc.close()
    reused, total = job.result.reused_tokens, PROMPT * TABLES
    assert reused > 0
    run_log().record(model="leftovers-kitchen", device="cpu", result=job.result, queue_wait_s=0.0)  # the newest kind
    page = APP_DIR / DASHBOARD.path
    at = AppTest.from_file(str(page), default_timeout=60).run()
    assert not at.exception, at.exception
    words = f"1 of these runs started from leftovers: {reused:,} of {total:,} prompt tokens reused"
    captions = [c.value for c in at.caption]
    assert any(words in c for c in captions), captions
