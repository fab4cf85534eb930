"""Batch-invariant mode (engine/invariance.py): an answer is the same bits alone and in a crowd.

Each check runs in a process of its own, because MKL fixes its summation mode at the process's
first matrix product (and this test process has multiplied long before). The crowd is served with
continuous batching and a small token budget, so prompts are prefilled in chunks beside other
prompts' decode steps: the products change shape at every step. Log-probabilities are compared bit
for bit, which is stricter than the tokens (they fork only at a tie)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest
from kitchen_server import kitchen_process
from proc_kit import run

from engine import Engine
from engine.errors import EngineError
from engine.invariance import FLOORS, MKL_ENV, no_floor_line, row_floor

REPO = Path(__file__).resolve().parent.parent

CROWD = """
import json, random, sys
from engine import Engine
from engine.events import Token
from engine.invariance import products_invariant
invariant = sys.argv[1] == "1"
alone_kitchen = Engine.load("chef", policy="continuous", batch_invariant=invariant)
crowd_kitchen = Engine.load("chef", policy="chunked", token_budget=48, prefix_cache=True, batch_invariant=invariant)
rng = random.Random(0)
system = [rng.randrange(5, 2000) for _ in range(40)]  # a shared system prompt: reused from the cache
prompts = [system + [rng.randrange(5, 2000) for _ in range(rng.randrange(3, 60))] for _ in range(6)]
prompts += [[rng.randrange(5, 2000) for _ in range(rng.randrange(8, 90))] for _ in range(4)]
def serve(eng, ps):
    ids = [eng.submit(p, max_new_tokens=12, logprobs=1) for p in ps]
    out = {i: [] for i in ids}
    while not eng.idle:
        for ev in eng.step():
            if isinstance(ev, Token):
                out[ev.request_id].append([ev.token_id, ev.logprob])
    return [out[i] for i in ids]
alone = [serve(alone_kitchen, [p])[0] for p in prompts]
crowd = serve(crowd_kitchen, prompts)
crowd_hits = crowd_kitchen.serving_state().prefix_hits
# a next turn: the first prompt, its reply and more, served where the reply's seat is a leftover
turn = prompts[0] + [t for t, _ in crowd[0]] + [7, 8, 9]
again = [serve(alone_kitchen, [turn])[0], serve(crowd_kitchen, [turn])[0]]
turn_hits = crowd_kitchen.serving_state().prefix_hits - crowd_hits
print(json.dumps({"probe": products_invariant(), "alone": alone, "crowd": crowd, "turn": again,
                  "hits": [crowd_hits, turn_hits], "reply_from": len(prompts[0])}))
"""


def crowd_run(invariant: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != MKL_ENV}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    done = run([sys.executable, "-c", CROWD, "1" if invariant else "0"], env=env, cwd=REPO, timeout=240)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_answer_in_a_crowd_is_the_same_bits_as_alone():
    """Alone: one prompt at a time, whole, no cache. The crowd: all ten at once, chunked by a
    48-token budget beside each other's decode steps, six of them reusing a cached 40-token
    prefix. Then a next turn that reuses a seat holding a reply the engine generated."""
    got = crowd_run(invariant=True)
    assert got["probe"] is True
    assert len(got["alone"]) == 10 and all(len(a) == 12 for a in got["alone"])
    crowd_hits, turn_hits = got["hits"]
    assert crowd_hits >= 40  # some of the crowd took the system prompt from the cache
    assert turn_hits > got["reply_from"]  # the next turn took its prompt and part of the reply from the cache
    assert got["crowd"] == got["alone"]  # token ids and float32 log-probabilities, bit for bit
    assert got["turn"][1] == got["turn"][0]


def test_without_the_mode_the_crowd_rounds_differently():
    """Why the mode exists: by default MKL sums one row (a GEMV) and a batch's rows (GEMMs)
    in different orders, so the crowd's log-probabilities differ in the last bits."""
    got = crowd_run(invariant=False)
    assert got["probe"] is False
    differ = [a != c for a, c in zip(got["alone"], got["crowd"], strict=True)]
    assert sum(differ) >= 1, "every crowd log-probability equalled its alone twin without the mode"


def test_the_mode_refuses_what_it_cannot_hold_in_one_line(monkeypatch):
    monkeypatch.delenv(MKL_ENV, raising=False)  # restored after the test: require() sets it
    for kwargs, words in [
        ({"quant": "int8"}, "float32 on CPU only (asked: float32, int8 on cpu)"),
        ({"dtype": "bfloat16"}, "float32 on CPU only (asked: bfloat16 on cpu)"),
        ({"compile": True}, "runs the eager step"),
    ]:
        with pytest.raises(EngineError) as err:
            Engine.load("chef", batch_invariant=True, **kwargs)
        assert words in str(err.value) and "\n" not in str(err.value)


def test_the_row_floor_is_measured_from_the_products_themselves():
    """Row 0's bits against a 64-row product's: exact sums agree at every count (floor 1); sums taken
    another way below 4 rows give floor 4; sums that move with every count give no floor, and the
    mode refuses in one line."""

    def exact(a, b):
        return (a.double() @ b.double()).float()

    def gemv_below_4(a, b):
        return exact(a, b) if a.shape[0] >= 4 else a @ b  # float32 sums: other bits than exact's

    def every_count_differs(a, b):
        return exact(a, b) * (1 + a.shape[0] * 2.0**-20)

    assert row_floor(exact) == 1
    assert row_floor(gemv_below_4) == 4
    assert row_floor(every_count_differs) is None
    line = no_floor_line()
    assert "\n" not in line and f"from at most {FLOORS[-1]} rows up" in line and f"{MKL_ENV}=AUTO,STRICT" in line


def test_the_class_kitchen_serves_batch_invariant_over_http():
    """`two-pot-kitchen serve --batch-invariant`: the server says so, and students ordering at once
    get the log-probabilities each prompt gets alone."""
    prompts = [f"{who}: what shall we cook tonight, and for how many?" for who in ("ROMEO", "JULIET", "NURSE", "FRIAR")]

    async def order(http, url, prompt):
        body = {"model": "chef", "prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 0}
        r = await http.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["logprobs"]["token_logprobs"]

    async def main(url):
        async with httpx.AsyncClient() as http:
            alone = [await order(http, url, p) for p in prompts]
            crowd = await asyncio.gather(*(order(http, url, p) for p in prompts))
            return alone, list(crowd)

    with kitchen_process("--batch-invariant", "--threads", "1") as (url, _):
        about = httpx.get(url + "/kitchen", timeout=10)
        assert about.status_code == 200 and about.json()["batch_invariant"] is True
        alone, crowd = asyncio.run(main(url))
    assert all(len(a) == 10 for a in alone) and crowd == alone
