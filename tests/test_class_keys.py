"""With `--api-key`, every route of the class kitchen that touches orders needs the key (a wrong or
missing one: 401, one line), found by walking the app's own route table, so a route added later is
covered too; and the class board never shows another student's prompt, text or ids."""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest
from kitchen_server import kitchen
from starlette.routing import Route

from serving.http.auth import OPEN_PATHS

KEY = "class-key-456"


@pytest.fixture(scope="module")
def served():
    with kitchen(api_key=KEY) as (url, client):
        yield url, client


def routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route, path parameters filled with a placeholder."""
    found = []
    for r in app.routes:
        if isinstance(r, Route):
            path = re.sub(r"\{[^}]+\}", "x", r.path)
            found += [(m, path) for m in sorted(r.methods or ["GET"]) if m != "HEAD"]
    return found


def test_every_route_but_health_and_metrics_needs_the_key(served):
    url, client = served
    table = routes(client.app)
    assert {p for _, p in table} >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/kitchen",
                                     "/kitchen/board", "/kitchen/orders", "/kitchen/lab/x"}  # fmt: skip
    for method, path in table:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, url + path, headers=headers, json={}, timeout=30)
            if path in OPEN_PATHS:
                assert r.status_code == 200, (method, path)
                continue
            assert r.status_code == 401, (method, path, headers, r.status_code)
            message = r.json()["error"]["message"]
            assert "API key" in message and "\n" not in message
    right = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(url + "/kitchen", headers=right).status_code == 200
    assert httpx.get(url + "/kitchen/board", headers=right).status_code == 200


def test_the_board_shows_no_other_students_text_or_ids(served):
    url, _ = served
    auth = {"Authorization": f"Bearer {KEY}"}
    theirs: dict = {}
    cooking = threading.Event()

    def other_student() -> None:  # a long order (EOS ignored), cooking from its first token until we have looked
        body = {"prompt": "TYBALT: secret words", "max_tokens": 400, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=auth, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ev = json.loads(line[6:])
                    theirs["id"] = ev["id"]
                    theirs["text"] = theirs.get("text", "") + "".join(c["text"] for c in ev["choices"])
                    cooking.set()

    t = threading.Thread(target=other_student)
    t.start()
    assert cooking.wait(60)  # their order is in the kitchen before we order and look
    mine = httpx.post(url + "/v1/completions", json={"prompt": "ROMEO: my own", "max_tokens": 40, "temperature": 0},
                      headers=auth, timeout=60).json()  # fmt: skip
    boards = [httpx.get(url + "/kitchen/board", params={"order": mine["id"]}, headers=auth).json() for _ in range(3)]
    t.join(60)
    seen = json.dumps(boards)
    assert boards[0]["in_kitchen"] >= 1  # the other student's order was in the kitchen while we looked
    assert theirs["id"] not in seen and "TYBALT" not in seen and "secret" not in seen
    assert theirs["text"][:20] not in seen and mine["choices"][0]["text"][:20] not in seen
    assert not re.search(r'"r\d+', seen)  # the server's own request keys never leave it
    for b in boards:
        assert all(set(t) == {"ticket", "mine", "state", "prompt_tokens", "tokens", "waited_s"} for t in b["tickets"])
        assert all(not t["mine"] for t in b["tickets"])  # our own order had finished: nothing of ours is marked
