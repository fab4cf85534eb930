"""The class board on a real class kitchen: the whole class in the pot, your tickets marked, nothing leaked."""

from __future__ import annotations

import json
import threading

import httpx
from kitchen_server import kitchen

from serving.clients.remote_order import board, order_remote


def test_the_board_shows_the_whole_class_and_marks_only_your_tickets():
    with kitchen() as (url, _):
        results, during = {}, []

        def order(name: str, prompt: str, n: int, on_chunk=None) -> None:
            results[name] = order_remote(url, "chef", prompt, n, on_chunk=on_chunk)

        second = threading.Thread(target=order, args=("b", "JULIET:", 96))  # long enough to be seen cooking

        def first_chunks(o) -> None:
            if len(o.chunk_times) == 1:  # the first order is cooking: a second student orders
                second.start()
            elif len(o.chunk_times) % 8 == 0 and second.is_alive():
                during.append(board(url, o.order_id))

        first = threading.Thread(target=order, args=("a", "ROMEO:", 240, first_chunks))
        first.start()
        first.join(120)
        second.join(120)
        a, b = results["a"], results["b"]
        assert a.order_id and b.order_id and a.order_id != b.order_id

        # while both cooked, the first student saw two tickets in the kitchen, exactly one of them theirs
        both = [snap for snap in during if len(snap["tickets"]) == 2]
        assert both, during
        assert all(sum(t["mine"] for t in snap["tickets"]) == 1 for snap in both)

        after = board(url, a.order_id)
        steps = after["steps"]
        first_step = min(s["index"] for s in steps if s["mine"])
        assert any(s["mine"] == 1 and s["batch"] == 2 for s in steps)  # the pot held both orders at once
        assert any(s["joined"] == 1 and s["index"] > first_step for s in steps)  # a ticket joined mid-service
        assert sum(s["mine"] for s in steps) >= 240  # every step that cooked one of the first order's tokens
        assert after["tickets"] == [] and after["in_kitchen"] == 0  # both done: the rail is empty
        assert after["kitchen"]["finished"] >= 2 and after["kitchen"]["ttft_p50_s"] > 0
        assert after["kitchen"]["tpot_p50_s"] > 0

        theirs = board(url, b.order_id)["steps"]
        assert sum(s["mine"] for s in theirs) == 96  # the second student's own steps, and only those
        assert all(s["mine"] == 0 for s in board(url)["steps"])  # no order named: nothing is anyone's

        raw = json.dumps([after, *during])
        assert "ROMEO" not in raw and "JULIET" not in raw and b.order_id not in raw and a.order_id not in raw
        assert board(url, since=steps[-1]["index"])["steps"] == []  # only steps after `since`


def test_bad_board_requests_get_one_line():
    with kitchen(api_key="k") as (url, _):
        r = httpx.get(url + "/kitchen/board")
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        r = httpx.get(url + "/kitchen/board", params={"since": "soon"}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 400 and r.json()["error"]["message"] == "since must be a step number (got 'soon')"
        assert board(url, api_key="k")["tickets"] == []
        assert board(url) is None  # refused: the page shows no rail rather than an error


def test_the_rail_draws_your_tickets_apart_from_the_others():
    from kitchen_viz.class_rail import batch_figure, rail_html, you_and_kitchen, your_steps

    snap = {
        "tickets": [
            {"ticket": 7, "mine": True, "state": "running", "prompt_tokens": 12, "tokens": 5, "waited_s": None},
            {"ticket": 8, "mine": False, "state": "waiting", "prompt_tokens": 300, "tokens": 0, "waited_s": 0.4},
        ],
        "in_kitchen": 5,
        "steps": [
            {"index": 1, "t": 10.0, "seconds": 0.01, "batch": 1, "mine": 0, "joined": 1},
            {"index": 2, "t": 10.1, "seconds": 0.02, "batch": 2, "mine": 1, "joined": 1},
            {"index": 3, "t": 10.2, "seconds": 0.01, "batch": 1, "mine": 0, "joined": 0},
            {"index": 4, "t": 10.3, "seconds": 0.01, "batch": 1, "mine": 1, "joined": 0},
            {"index": 5, "t": 10.4, "seconds": 0.01, "batch": 3, "mine": 0, "joined": 2},
        ],
        "kitchen": {"finished": 4, "ttft_p50_s": 0.02, "tpot_p50_s": 0.004},
    }
    html = rail_html(snap)
    assert "you · #7" in html and "#8" in html and "you · #8" not in html
    assert "dashed" in html and "waiting for a seat" in html and "and 3 more" in html
    assert [s["index"] for s in your_steps(snap)] == [2, 3, 4]  # from your first step to your last
    yk = you_and_kitchen(0.05, 0.006, snap)
    assert (yk.your_steps, yk.shared_steps, yk.kitchen_finished) == (2, 1, 4)
    fig = batch_figure(your_steps(snap))
    assert [t.name for t in fig.data] == ["sequences in the pot", "a step that cooked your order",
                                         "a ticket joined the pot"]  # fmt: skip
    assert "The rail is empty" in rail_html({"tickets": []})
