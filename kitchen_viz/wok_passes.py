"""The wok's tosses: how many passes the kitchen really made for an order's prompts, and why.

A banquet's prompts do not always fit one pass. The kitchen's scheduler gives each pass a token
budget (the wok's size: how many tokens one toss holds), so 4 prompts of 2,048 tokens in a wok of
512 tokens a toss take 16 tosses, and in a shared kitchen the bowls other orders ladle ride in the
same passes. The engine tells each pass (engine/events.py `WokPass`); this module words them for
the drawing, the live panels and the timeline, in one line each.

Worked example: passes of 512, 512, ... (16 of them), wok 512, 8,192 prompt tokens cooked ->
why_tosses(...) == "the wok holds 512 tokens a toss and this order's prompts are 8,192 tokens: 16 tosses".
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.units import fmt_s


@dataclass(frozen=True)
class Toss:
    """One pass of the order's wok, on the order's clock."""

    t_start: float
    t_end: float
    tokens: int  # the order's prompt tokens this pass cooked
    pass_tokens: int  # every token in the pass (other orders' and bowls ladled alongside included)
    first_bowls: int  # the order's tables served their first token by this pass

    @classmethod
    def of(cls, ev) -> Toss:
        return cls(ev.t_start, ev.t, ev.tokens, ev.pass_tokens, ev.first_bowls)


def expected_tosses(cooked: int, wok: int) -> int:
    """At least this many passes for `cooked` prompt tokens in a wok of `wok` tokens (ceil)."""
    return max(1, -(-cooked // wok)) if wok > 0 else 1


def why_tosses(tosses: list[Toss], wok: int, cooked: int) -> str:
    """One line: why the order's prompts took these passes; "" for a single pass.

    The wok's size decides when the prompts outgrow it; otherwise the tables waited (for a seat,
    for KV memory) or other orders' tokens shared the passes."""
    n = len(tosses)
    if n <= 1:
        return ""
    others = sum(max(0, t.pass_tokens - t.tokens) for t in tosses)
    shared = f"; {others:,} tokens of the pot's bowls and other orders rode in the same tosses" if others else ""
    if wok and cooked > wok:
        return f"the wok holds {wok:,} tokens a toss and this order's prompts are {cooked:,} tokens: {n} tosses{shared}"
    return f"{n} tosses although the wok holds {wok:,} tokens: tables waited for a seat or KV memory{shared}"


def toss_now(tosses: list[Toss], t: float) -> int:
    """How many of the tosses had started by `t` (the one in the wok at `t` is the last of them)."""
    return sum(1 for x in tosses if x.t_start <= t)


def live_words(tosses: list[Toss], wok: int, total: int, tables: int) -> str:
    """While the wok is still on: "toss 5 of 16 · 1 of 4 tables has its first bowl · the wok holds 512 tokens a toss"."""
    if not tosses:
        return ""
    cooked = sum(x.tokens for x in tosses)
    of = max(expected_tosses(total, wok), len(tosses) + (cooked < total))
    served = sum(x.first_bowls for x in tosses)
    return (f"toss {len(tosses) + 1} of about {of} · {served} of {tables} tables have their first bowl · "
            f"the wok holds {wok:,} tokens a toss")  # fmt: skip


def tosses_words(tosses: list[Toss]) -> str:
    """The timeline's words for the passes: "16 tosses: 120.5 ms, 118.0 ms, ... (cooking 1.90 s of the 2.40 s span)"."""
    if len(tosses) <= 1:
        return ""
    cooking = sum(x.t_end - x.t_start for x in tosses)
    span = tosses[-1].t_end - tosses[0].t_start
    shown = ", ".join(fmt_s(x.t_end - x.t_start) for x in tosses[:4]) + (", …" if len(tosses) > 4 else "")
    return f"{len(tosses)} tosses ({shown}): cooking {fmt_s(cooking)} of the wok's {fmt_s(span)}"
