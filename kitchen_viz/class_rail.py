"""The whole class on the rail: every order in the class kitchen as a ticket, yours highlighted.

A class kitchen's board (serving/http/board.py) says which tickets are in the kitchen, which are
yours, and what each recent step held. This turns it into what a student sees on the order page:

  rail_html     the tickets cooking or waiting now, left to right in arrival order: yours in the
                wok's orange with "you", the others grey and anonymous ("#12"), a waiting ticket
                dashed; each with its prompt size and the tokens it has so far
  batch_figure  the pot's batch size at every step while your order cooked, the steps that made
                one of your tokens marked, and the tickets that joined the pot mid-service
  you_and_kitchen  your TTFT / TPOT (measured at the client) beside the kitchen's medians over
                its last minute (measured by the kitchen)

Example: board tickets [{ticket 7, mine}, {ticket 8}] -> two cards, "you · #7" highlighted, "#8".
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

import plotly.graph_objects as go

from kitchen_viz.charts import legible

YOU, OTHERS = "#e8590c", "#868e96"  # the wok's orange; a neutral grey readable on light and dark


def rail_html(board: dict, counts: bool = True) -> str:
    """The tickets as cards. `counts=False` leaves out each ticket's tokens so far: the Kitchen's live
    scene then redraws the rail only when a ticket joins, leaves or gets its seat (a browser's redraw
    on every token shares the engine's cores; docs/benchmarks/ui-overhead.md). A board marked
    `pending` (serving/host_client.py, before its first read) draws one placeholder card: the
    rail has its height from the Cook's first drawing, so its first read while the engine cooks
    does not push the kitchen below it down (a relayout and repaint of the whole page)."""
    tickets = board.get("tickets", [])
    if board.get("pending"):  # the board is not read yet: a card's place, so the first read moves nothing
        return (f"<div class='tpk-rail' style='line-height:1.2'><span style='display:inline-block;margin:2px 4px;"
                f"padding:2px 8px;border:2px dashed {OTHERS};border-radius:6px'>reading the board…<br>"
                "<small>your tickets appear here</small></span></div>")  # fmt: skip
    if not tickets:
        return "<div class='tpk-rail'><em>The rail is empty: no order is cooking or waiting.</em></div>"
    cards = []
    for t in tickets:
        mine, waiting = t["mine"], t["state"] == "waiting"
        colour = YOU if mine else OTHERS
        border = f"2px {'dashed' if waiting else 'solid'} {colour}"
        name = f"you · #{t['ticket']}" if mine else f"#{t['ticket']}"
        state = "waiting for a seat" if waiting else f"{t['tokens']} tok" if counts else "cooking"
        cards.append(
            f"<span style='display:inline-block;margin:2px 4px;padding:2px 8px;border:{border};border-radius:6px;"
            f"{'font-weight:700;background:' + colour + '22;' if mine else ''}'>"
            f"{escape(name)}<br><small>{t['prompt_tokens']} in · {escape(state)}</small></span>"
        )
    more = board.get("in_kitchen", len(tickets)) - len(tickets)
    tail = f" <small>and {more} more</small>" if more > 0 else ""
    return f"<div class='tpk-rail' style='line-height:1.2'>{''.join(cards)}{tail}</div>"


def your_steps(board: dict) -> list[dict]:
    """The board's steps from the first that held one of your tickets to the last (others' steps
    in between included: the pot does not stop cooking for them between your tokens)."""
    steps = board.get("steps", [])
    marked = [i for i, s in enumerate(steps) if s["mine"]]
    return steps[marked[0] : marked[-1] + 1] if marked else []


def batch_figure(steps: list[dict], presenter: bool = False) -> go.Figure:
    t0 = steps[0]["t"] - steps[0]["seconds"] if steps else 0.0
    x = [s["t"] - t0 for s in steps]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[s["batch"] for s in steps], mode="lines", line=dict(color=OTHERS, shape="hv"),
                             name="sequences in the pot"))  # fmt: skip
    mine = [(xi, s["batch"]) for xi, s in zip(x, steps, strict=True) if s["mine"]]
    if mine:
        fig.add_trace(go.Scatter(x=[m[0] for m in mine], y=[m[1] for m in mine], mode="markers",
                                 marker=dict(color=YOU, size=5), name="a step that cooked your order"))  # fmt: skip
    joined = [(xi, s["batch"], s["joined"]) for xi, s in zip(x, steps, strict=True) if s["joined"]]
    if joined:
        fig.add_trace(go.Scatter(x=[j[0] for j in joined], y=[j[1] for j in joined], mode="markers",
                                 marker=dict(symbol="triangle-up", size=11, color="#1971c2"),
                                 text=[f"{j[2]} ticket(s) joined" for j in joined], hoverinfo="text+x",
                                 name="a ticket joined the pot"))  # fmt: skip
    fig.update_layout(
        height=420 if presenter else 380, title="The pot while your order cooked",
        xaxis_title="seconds since your order's first step", yaxis_title="sequences in the step",
        yaxis=dict(rangemode="tozero"),
    )  # fmt: skip
    return legible(fig, presenter)


@dataclass(frozen=True)
class YouAndClass:
    your_ttft_s: float | None
    your_tpot_s: float | None
    kitchen_ttft_s: float | None  # median over the requests the kitchen finished in its last minute
    kitchen_tpot_s: float | None
    kitchen_finished: int
    shared_steps: int  # steps that cooked your order together with someone else's
    your_steps: int


def you_and_kitchen(ttft_s: float | None, tpot_s: float | None, board: dict) -> YouAndClass:
    k, steps = board.get("kitchen", {}), your_steps(board)
    mine = [s for s in steps if s["mine"]]
    return YouAndClass(
        ttft_s, tpot_s, k.get("ttft_p50_s"), k.get("tpot_p50_s"), k.get("finished", 0),
        sum(s["batch"] > s["mine"] for s in mine), len(mine),
    )  # fmt: skip
