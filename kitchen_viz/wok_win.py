"""Sizing an order that makes the wok win: from the model's limits and this machine's measured rates.

Why an order needs sizing: which pot is the bottleneck depends on the machine. TTFT is about
prompt tokens / the wok's rate; the pot adds one TPOT per new token after the first. An order makes
the wok win (TTFT at least the diagnosis's 60 % of E2E, lab/inspector.py) when

    prompt / wok_rate  >=  TARGET_SHARE / (1 - TARGET_SHARE) x (new - 1) x TPOT

so the longest prompt the model's context allows, with as many new tokens as that still leaves
to the pot. The rates come from what this kitchen measured (the session's last order, else the
server's run log); before anything was measured the order asks for the fewest new tokens that
still show a decode step (2), which no machine can turn into a pot win with the longest prompt.

Worked example (the chef, context 512): measured wok 1,400 tok/s, TPOT 4.0 ms. With 2 new tokens
the prompt may be 510 tokens, TTFT about 364 ms; at TARGET_SHARE 0.75 the pot may take 121 ms,
so 1 + 30 = 31 new tokens, and the prompt becomes 481 (the context keeps 31 for the reply):
TTFT about 344 ms against 120 ms of pot, 74 % of E2E predicted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lab.units import fmt_s

TARGET_SHARE = 0.75  # aimed above the diagnosis's 60 %, so the machine's noise keeps the wok the winner
FEWEST_NEW = 2  # one decode step: the pot is there to be beaten


@dataclass(frozen=True)
class Rates:
    """What this machine measured: the wok's tokens per second and the pot's time per token."""

    wok_tps: float  # prompt tokens computed per second of the wok's pass (reused ones not counted)
    tpot_s: float  # the pot's mean time per output token
    source: str  # where they were measured, in words ("your last order")


@dataclass(frozen=True)
class PrefillWinOrder:
    prompt: int
    batch: int
    new: int
    predicted_share: float | None  # TTFT / E2E predicted from the rates; None before anything was measured
    why: str  # one line for the page


def rates_from(metrics, source: str) -> Rates | None:
    """Rates from an order's metrics (engine/trace.py Metrics); None when it lacks a wok rate or a decode step."""
    if metrics is None or not metrics.prefill_tps or not metrics.tpot_s:
        return None
    return Rates(metrics.prefill_tps, metrics.tpot_s, source)


def wok_win_order(longest_prompt: Callable[[int], int], most_new: int, rates: Rates | None) -> PrefillWinOrder:
    """One table, the longest prompt, and as many new tokens as keep TTFT >= TARGET_SHARE of E2E.

    `longest_prompt(new)` is the Kitchen's prompt ceiling for `new` new tokens (the model's context
    and the KV budget, kitchen_viz/orders.py prompt_ceiling); `most_new` the reply's ceiling."""
    new = min(FEWEST_NEW, most_new)
    prompt = longest_prompt(new)
    if rates is None:
        return PrefillWinOrder(prompt, 1, new, None, (
            f"the longest prompt this model takes ({prompt:,} tokens) and {new} new tokens; nothing "
            "measured yet, so the pot gets a single step (cook once and this order is sized from the rates)"
        ))  # fmt: skip
    ttft = prompt / rates.wok_tps
    allowed = ttft * (1 - TARGET_SHARE) / TARGET_SHARE  # the pot's share of E2E stays at 1 - TARGET_SHARE
    new = max(min(FEWEST_NEW, most_new), min(most_new, 1 + int(allowed / rates.tpot_s)))
    prompt = longest_prompt(new)
    ttft, pot = prompt / rates.wok_tps, (new - 1) * rates.tpot_s
    share = ttft / (ttft + pot) if ttft + pot > 0 else 1.0
    return PrefillWinOrder(prompt, 1, new, share, (
        f"the longest prompt this model takes with {new} new tokens ({prompt:,}); from {rates.source} "
        f"(wok {rates.wok_tps:,.0f} tok/s, TPOT {fmt_s(rates.tpot_s)}) TTFT should be about "
        f"{share:.0%} of E2E"
    ))  # fmt: skip
