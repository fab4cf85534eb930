"""Orders survive their engine: killed (SIGKILL) or hung (the watchdog) in the middle of 20 streaming
requests, the kitchen restarts its engine and resubmits every request from the tokens it had
streamed; each client's stream goes on with no error event and ends with the answer it would have
had without the crash. A poison order (one that crashes every engine it reaches, made so by the
loop's test hook `TWO_POT_TEST_POISON`) ends alone with one line, and the others complete.

The real chef, on a real server on 127.0.0.1, in batch-invariant mode: a resumed request's prompt
(its prompt + the tokens streamed) is prefilled where the first engine decoded it token by token,
and only batch invariance makes the two the same bits (serving/host/recovery.py says what holds
without it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from contextlib import contextmanager

import httpx
import pytest
from kitchen_server import serve

from engine.settings import EngineSettings
from serving.caps import Caps
from serving.host.loop import POISON_ENV, LoopSettings
from serving.host.watchdog import SILENCE_ENV
from serving.http.server import ServerConfig, create_app, open_host

WAIT_S = 120
PROMPTS = [f"{name}:\n" for name in ("ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE", "CAPULET", "BENVOLIO",
                                      "PARIS", "FRIAR", "LADY", "PRINCE", "SAMPSON", "GREGORY", "ABRAHAM",
                                      "BALTHASAR", "PETER", "HAMLET", "OPHELIA", "HORATIO", "LAERTES")]  # fmt: skip
MAX_TOKENS = 48
SAMPLED = {"temperature": 0.9, "seed": 7}  # one sampled request beside the greedy ones: its generator is carried


@contextmanager
def kitchen():
    """The chef behind the class server's app, batch-invariant, on a free loopback port: (url, process)."""
    engine = EngineSettings(policy="chunked", token_budget=64, prefix_cache=True, batch_invariant=True)
    host = open_host("chef", LoopSettings("chef", engine, threads=1), Caps(max_order_seconds=120))
    try:
        assert host.wait_ready(WAIT_S), host.status
        with serve(create_app(host, ServerConfig(host.name, None, host.caps))) as url:
            yield url, host.process
    finally:
        host.close()


async def stream(client: httpx.AsyncClient, url: str, prompt: str, seen: list, extra: dict | None = None) -> dict:
    """One streaming request: its text, its error events, and its tokens' count as they arrive (`seen`)."""
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, **(extra or {})}
    text, errors = "", []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    errors.append(event["error"]["message"])
                else:
                    text += event["choices"][0]["text"]
                    seen.append(1)
    return {"text": text, "errors": errors}


async def class_of_twenty(url: str, crash, late: str | None = None) -> list[dict]:
    """20 greedy streams and one sampled; once every one has streamed a few chunks, `crash()` runs
    (and `late`, a 22nd prompt, is sent). Returns each request's outcome, the late one last."""
    seen = [[] for _ in range(len(PROMPTS) + 2)]
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        tasks = [asyncio.create_task(stream(client, url, p, seen[i])) for i, p in enumerate(PROMPTS)]
        tasks.append(asyncio.create_task(stream(client, url, "ROMEO:\n", seen[-2], SAMPLED)))
        deadline = time.monotonic() + WAIT_S
        while crash is not None and not all(len(s) >= 2 for s in seen[:-1]):
            assert time.monotonic() < deadline and not any(t.done() for t in tasks), "the class ended before the crash"
            await asyncio.sleep(0.01)
        if crash is not None:
            crash()
        if late is not None:
            tasks.append(asyncio.create_task(stream(client, url, late, seen[-1])))
        return list(await asyncio.gather(*tasks))


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(next(ln for ln in text.splitlines() if ln.startswith(f"twopot:{name}{{")).rsplit(" ", 1)[1])


def assert_whole(outs: list[dict], reference: list[dict]) -> None:
    for out, ref in zip(outs, reference, strict=True):
        assert out["errors"] == [] and out["text"] == ref["text"], (out, ref)


def test_a_killed_engine_loses_no_stream_and_every_answer_is_the_uncrashed_one():
    with kitchen() as (url, process):
        reference = asyncio.run(class_of_twenty(url, None))
        assert all(r["errors"] == [] and r["text"] for r in reference)
        old = process.pid
        killed = {}

        def kill():
            killed["at"] = time.monotonic()
            os.kill(old, signal.SIGKILL)

        outs = asyncio.run(class_of_twenty(url, kill))
        took = time.monotonic() - killed["at"]
        print(f"\n21 streams through a SIGKILL: all ended {took:.1f} s after it; resumed {process.recovery.resumed}")
        assert_whole(outs, reference)  # the 20 greedy answers and the sampled one, as if nothing happened
        assert process.pid != old and process.restarts == 1 and httpx.get(url + "/health").json()["restarts"] == 1
        assert metric(url, "engine_restarts_total") == 1 and metric(url, "requests_poisoned_total") == 0
        assert 1 <= metric(url, "requests_resumed_total") == process.recovery.resumed <= 21


def test_a_poison_order_that_kills_its_engine_twice_ends_alone_in_one_line(monkeypatch):
    monkeypatch.setenv(POISON_ENV, "kill:POISONED")  # every engine this kitchen starts dies on that order
    with kitchen() as (url, process):
        reference = asyncio.run(class_of_twenty(url, None))
        outs = asyncio.run(class_of_twenty(url, lambda: None, late="POISONED ROMEO:\n"))
        poison = outs.pop()
        assert_whole(outs, reference)
        assert poison["text"] == "" and len(poison["errors"]) == 1 and "\n" not in poison["errors"][0]
        assert "failed twice" in poison["errors"][0] and "exit code -9" in poison["errors"][0]
        assert process.restarts == 2 and metric(url, "requests_poisoned_total") == 1
        after = httpx.post(url + "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0})
        assert after.status_code == 200 and after.json()["choices"][0]["text"] == reference[0]["text"]


def test_a_hung_engine_is_stopped_and_every_stream_goes_on(monkeypatch):
    """The first engine hangs (alive, silent) on an order in the middle of the class; the watchdog
    stops it, and the fresh engine (started without the hook) finishes every stream, that one too."""
    monkeypatch.setenv(SILENCE_ENV, "4")
    monkeypatch.setenv(POISON_ENV, "hang:STALLS")
    with kitchen() as (url, process):
        monkeypatch.delenv(POISON_ENV)  # the replacement engine behaves
        t0 = time.monotonic()
        outs = asyncio.run(class_of_twenty(url, lambda: None, late="STALLS ROMEO:\n"))
        took = time.monotonic() - t0
        reference = asyncio.run(class_of_twenty(url, None, late="STALLS ROMEO:\n"))
        print(f"\n22 streams through a hang stopped by the watchdog: {took:.1f} s in all")
        assert_whole(outs, reference)
        assert process.restarts == 1 and metric(url, "engine_restarts_total") == 1


def test_a_poison_order_that_hangs_its_engine_twice_ends_alone_in_one_line(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "4")
    monkeypatch.setenv(POISON_ENV, "hang:STALLS")
    with kitchen() as (url, process):
        outs = asyncio.run(class_of_twenty(url, lambda: None, late="STALLS ROMEO:\n"))
        poison = outs.pop()
        monkeypatch.delenv(POISON_ENV)
        assert all(o["errors"] == [] and o["text"] for o in outs), outs
        assert poison["text"] == "" and len(poison["errors"]) == 1 and "\n" not in poison["errors"][0]
        assert "failed twice" in poison["errors"][0] and "hung" in poison["errors"][0]
        assert process.restarts == 2 and metric(url, "requests_poisoned_total") == 1
        reference = asyncio.run(class_of_twenty(url, None))
        assert_whole(outs, reference)


if __name__ == "__main__":
    pytest.main([__file__, "-x", "-q", "-s"])
