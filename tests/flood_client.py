"""One student's script flooding the class kitchen, in its own process, as it would run on the student's
own laptop: its 200 streams are read there, not on the event loop that times the classmates.

    python tests/flood_client.py URL USER N MAX_TOKENS

Sends N streaming greedy requests at once as OpenAI `user` USER, each asking for MAX_TOKENS tokens
(EOS ignored, so a served one holds its seat until hung up on). Prints one JSON line per request as
soon as its status is known: {"status": 200} or {"status": 429, "message": ..., "retry_after": ...}.
Reads every served stream until its stdin closes, then hangs up on all of them and prints
{"done": true, "tokens": T, "errors": E} (E: error events seen in the streams).
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx


async def one(client: httpx.AsyncClient, url: str, body: dict, seen: dict) -> None:
    try:
        await read(client, url, body, seen)
    except (httpx.HTTPError, ValueError, KeyError) as err:  # the test shows it: a flood request is never lost
        print(json.dumps({"status": None, "error": f"{type(err).__name__}: {err}"}), flush=True)


async def read(client: httpx.AsyncClient, url: str, body: dict, seen: dict) -> None:
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            message = json.loads(await r.aread())["error"]["message"]
            print(json.dumps({"status": r.status_code, "message": message, "retry_after": r.headers.get("retry-after")}),
                  flush=True)  # fmt: skip
            return
        print(json.dumps({"status": 200}), flush=True)
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                seen["errors"] += "error" in event
                seen["tokens"] += bool(event.get("choices") and event["choices"][0]["text"])


async def flood(url: str, user: str, n: int, max_tokens: int) -> None:
    seen = {"tokens": 0, "errors": 0}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        body = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "user": user, "ignore_eos": True}
        tasks = [asyncio.create_task(one(client, url, dict(body, prompt=f"Flood {i}:\n"), seen)) for i in range(n)]
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"done": True, **seen}), flush=True)


if __name__ == "__main__":
    asyncio.run(flood(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
