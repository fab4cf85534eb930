"""One student cannot flood the class: seats go round-robin across clients, and a client past its
cap (`max_client_orders`, the caps file) alone is refused with 429, one line and Retry-After.

The real chef in its own server process on 127.0.0.1. The flood has been taken in whole (each of its
200 requests cooking or refused) before the class asks: on two busy cores the server's intake of 200
connections alone takes seconds, and that is not what is measured here; a first come, first served
line would put the class behind the whole flood. The class's first-token times are compared
with the same class's alone, measured in the same run (twice: before and after the flood), so a busy
machine slows both sides of the ratio alike.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from kitchen_server import kitchen_process

from serving.http.fair import FairLine, OverCap, client_of

CAP = 16  # the flooder's cap: below the seats minus the class, so its flood never takes a classmate's seat
CLASS = 29
FLOOD = 200


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def first_token_s(client: httpx.AsyncClient, url: str, user: str, prompt: str, max_tokens: int,
                        answered: list | None = None) -> dict:
    """One streaming request: its status (also appended to `answered` as soon as it is known), seconds
    to its first text, and its refusal (body, Retry-After)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "user": user}
    t0 = time.perf_counter()
    out = {"status": None, "ttft_s": None, "errors": 0}
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        out["status"] = r.status_code
        if answered is not None:
            answered.append(r.status_code)
        if r.status_code != 200:
            out["body"], out["retry_after"] = json.loads(await r.aread()), r.headers.get("retry-after")
            return out
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                out["errors"] += "error" in event
                if out["ttft_s"] is None and event.get("choices") and event["choices"][0]["text"]:
                    out["ttft_s"] = time.perf_counter() - t0
    return out


async def the_class(client: httpx.AsyncClient, url: str) -> list[dict]:
    return list(await asyncio.gather(*[first_token_s(client, url, f"student-{i}", f"Student {i} asks:\n", 16)
                                       for i in range(CLASS)]))  # fmt: skip


async def class_beside_a_flood(url: str) -> dict:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        alone_before = await the_class(client, url)
        answered: list[int] = []
        flood = [asyncio.create_task(first_token_s(client, url, "flooder", f"Flood {i}:\n", 64, answered))
                 for i in range(FLOOD)]  # fmt: skip
        while len(answered) < FLOOD:  # the whole flood is in the server (cooking, or refused) before the class asks
            await asyncio.sleep(0.01)
        beside = asyncio.create_task(the_class(client, url))
        board = (await client.get(url + "/kitchen/board")).json()
        beside, flood = await beside, await asyncio.gather(*flood)
        alone_after = await the_class(client, url)
    return {"before": alone_before, "beside": beside, "after": alone_after, "flood": flood, "board": board}


def test_a_flooder_is_capped_alone_and_the_class_keeps_its_first_token_time(tmp_path):
    caps = tmp_path / "caps.toml"
    caps.write_text(f"[caps]\nmax_client_orders = {CAP}\n")
    with kitchen_process("--config", str(caps)) as (url, _):
        about = httpx.get(url + "/kitchen").json()
        assert about["caps"]["max_client_orders"] == CAP and about["seats"] >= CLASS + CAP, about
        r = asyncio.run(class_beside_a_flood(url))
        metrics = httpx.get(url + "/metrics").text
    for run in ("before", "beside", "after"):
        assert all(o["status"] == 200 and o["errors"] == 0 and o["ttft_s"] for o in r[run]), r[run]
    alone = max(p99([o["ttft_s"] for o in r["before"]]), p99([o["ttft_s"] for o in r["after"]]))
    beside = p99([o["ttft_s"] for o in r["beside"]])
    refused = [o for o in r["flood"] if o["status"] == 429]
    served = [o for o in r["flood"] if o["status"] == 200]
    print(f"\nclass of {CLASS}: TTFT p99 alone {alone * 1e3:.0f} ms (worse of two runs), beside a flood of {FLOOD} "
          f"{beside * 1e3:.0f} ms ({beside / alone:.2f}x); the flooder: {len(served)} served, {len(refused)} refused")
    assert beside <= 2 * alone, (beside, alone)
    # how many past the cap are refused depends on how fast the first 16 finish (a quick machine frees
    # seats while the flood still arrives): the rule is only that some are refused and none is lost
    assert len(served) + len(refused) == FLOOD and len(served) >= CAP and refused
    assert all(o["errors"] == 0 for o in served)
    for o in refused:
        line = o["body"]["error"]["message"]
        assert "\n" not in line and "max_client_orders" in line and f"limit is {CAP}" in line, line
        assert o["retry_after"] and o["retry_after"].isdigit() and int(o["retry_after"]) >= 1
    over = next(ln for ln in metrics.splitlines() if ln.startswith("twopot:request_over_client_cap_total{"))
    assert float(over.rsplit(" ", 1)[1]) == len(refused)
    clients = r["board"]["clients"]  # what any student sees: numbers and counts, nobody's text or name
    assert clients and all(set(c) == {"client", "orders", "mine"} for c in clients)
    assert max(c["orders"] for c in clients) <= CAP and "flooder" not in json.dumps(r["board"])


def test_free_seats_go_round_robin_across_clients():
    """Two seats; ann sends five, bob and cy one each: once ann's first two cook, every seat that
    frees goes to the next client in turn, so bob and cy wait for one more of ann's, not for all five."""

    async def run() -> list[str]:
        alive: set[str] = set()
        line = FairLine(seats=2, cap=5, alive=alive.__contains__)
        order: list[str] = []
        tickets = [(who, line.enter(who, 1)) for who in ["ann"] * 5 + ["bob", "cy"]]
        keys = iter(range(100))
        pending = list(tickets)
        while pending:
            for who, ticket in list(pending):
                if ticket.state == "released":
                    await ticket.wait()
                    key = f"{who}{next(keys)}"
                    alive.add(key)
                    line.seated(ticket, [key])
                    order.append(who)
                    pending.remove((who, ticket))
            await asyncio.sleep(0)
            cooking = sorted(alive)
            if cooking and not any(t.state == "released" for _, t in pending):
                alive.discard(cooking[0])  # the oldest finishes; its seat is free
                line.ended(cooking[0])
        try:
            line.enter("ann", 6)
        except OverCap as err:
            assert err.status == 429 and "max_client_orders" in err.message
        else:
            raise AssertionError("six tables past a cap of five were admitted")
        return order

    assert asyncio.run(run()) == ["ann", "ann", "ann", "bob", "cy", "ann", "ann"]


def test_who_a_client_is():
    assert client_of("Bearer own-key", "ada", "10.0.0.2", "class-key").startswith("key:")
    assert "own-key" not in client_of("Bearer own-key", None, None, None)  # a key is never kept in the clear
    assert client_of("Bearer class-key", "ada", "10.0.0.2", "class-key") == "user:ada"  # the class's key names no one
    assert client_of("", None, "10.0.0.2", None) == "address:10.0.0.2"
