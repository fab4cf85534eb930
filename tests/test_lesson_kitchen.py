"""The lesson's kitchen, on the real chef: the wok's passes as the scheduler ran them, leftovers
with an origin (and none from orders that cooked every token), the class named when it shared the
steps, and generated prompts that end where a word ends."""

from __future__ import annotations

import pytest

from engine.events import Done, PrefillEnd, Token, WokPass
from engine.request_group import RequestGroup
from kitchen_viz.orders import FILLER
from lab.class_share import class_share
from lab.inspector import diagnose
from serving.host.api import generated_prompts, word_starts
from serving.host.loop import filler_words

MAX_STEPS = 5000


@pytest.fixture(scope="module")
def eng():
    from engine import Engine

    return Engine.load("chef", policy="chunked", token_budget=64, max_seqs=16, prefix_cache=True)


@pytest.fixture
def kitchen(eng):
    drain(eng)
    eng.clear_leftovers()
    yield eng
    drain(eng)


def drain(eng) -> None:
    for _ in range(MAX_STEPS):
        if eng.idle:
            return
        eng.step()
    raise AssertionError("the engine did not become idle")


def cook(eng, order: RequestGroup) -> list:
    out = []
    for _ in range(MAX_STEPS):
        if order.done:
            return out
        out += order.take(eng.step())
    raise AssertionError("the order did not finish")


def prompts(n_tables: int, n_tokens: int) -> list[list[int]]:
    return generated_prompts(list(range(5, 400)), n_tokens, n_tables)


def test_a_banquet_over_the_budget_is_cooked_and_told_as_its_passes(kitchen):
    events = cook(kitchen, RequestGroup(kitchen, prompts(4, 100), 3, seed=0, reuse_prefix=False))
    live = [e for e in events if isinstance(e, WokPass)]
    end = next(e for e in events if isinstance(e, PrefillEnd))
    passes = end.passes
    assert len(passes) >= 400 // 64 and live == list(passes[:-1])  # each pass but the last is sent as it ends
    assert sum(p.tokens for p in passes) == 400 and all(p.pass_tokens <= 64 for p in passes)
    assert sum(p.first_bowls for p in passes) == 4 and [p.index for p in passes] == list(range(1, len(passes) + 1))
    result = next(e for e in events if isinstance(e, Done)).result
    # TTFT is one quantity: every table's first bowl, when the wok's last pass ended
    assert result.metrics.ttft_s == pytest.approx(end.t) and end.t == passes[-1].t
    first = min(e.t for e in events if isinstance(e, Token))
    assert first < end.t  # the first table's bowl came earlier: that is not the order's TTFT


def test_the_live_ttft_is_the_final_one_and_the_panels_tell_the_tosses(kitchen):
    """Folded as the page folds them: while later tables are still in the wok, the first table's
    bowls do not make a TTFT; once every table has one, TTFT is the engine's, to the digit."""
    from kitchen_viz.panels import panel_values
    from kitchen_viz.timeline import LiveRun

    events = cook(kitchen, RequestGroup(kitchen, prompts(4, 100), 3, seed=0, reuse_prefix=False, wok_tokens=32))
    run = LiveRun.for_order("r", [100] * 4, wok=32)
    end = next(i for i, e in enumerate(events) if isinstance(e, PrefillEnd))
    early = [e for e in events[:end] if isinstance(e, Token)]
    assert early  # a table had its first bowl before the wok was done
    run.consume(events[:end])
    live = panel_values(run)
    assert live.ttft_s is None and live.ttft_label == "TTFT, every table"
    assert live.wok.startswith("toss ") and "the wok holds 32 tokens a toss" in live.wok
    assert run.scene_data()["wok_live"] == live.wok
    run.consume(events)
    done = panel_values(run)
    result = next(e for e in events if isinstance(e, Done)).result
    assert done.final and done.ttft_s == result.metrics.ttft_s == run.t_first_token
    assert done.wok.startswith("the wok holds 32 tokens a toss and this order's prompts are 400 tokens:")
    assert len(run.scene_data()["tosses"]) == len(run.tosses) >= 400 // 32


def test_a_smaller_wok_makes_more_tosses(kitchen):
    events = cook(kitchen, RequestGroup(kitchen, prompts(2, 100), 2, seed=0, reuse_prefix=False, wok_tokens=16))
    passes = next(e for e in events if isinstance(e, PrefillEnd)).passes
    assert len(passes) >= 200 // 16 and all(p.pass_tokens <= 16 for p in passes)
    alone = cook(kitchen, RequestGroup(kitchen, prompts(1, 40), 2, seed=0, reuse_prefix=False))
    assert next(e for e in alone if isinstance(e, PrefillEnd)).passes == ()  # one pass: nothing extra to tell


def test_an_order_cooked_with_reuse_off_leaves_no_leftovers(kitchen):
    cook(kitchen, RequestGroup(kitchen, prompts(2, 30), 2, seed=0, reuse_prefix=False))
    again = cook(kitchen, RequestGroup(kitchen, prompts(2, 30), 2, seed=0, reuse_prefix=True))
    assert next(e for e in again if isinstance(e, Done)).result.reused_tokens == 0


def test_leftovers_say_whose_order_cooked_them_and_can_be_cleared(kitchen):
    first = cook(kitchen, RequestGroup(kitchen, prompts(2, 30), 2, seed=0, reuse_prefix=True))
    mine = next(e for e in first if isinstance(e, Done)).result
    second = next(e for e in cook(kitchen, RequestGroup(kitchen, prompts(2, 30), 2, seed=0, reuse_prefix=True))
                  if isinstance(e, Done)).result  # fmt: skip
    assert second.reused_tokens == 2 * 29 and set(second.reused_from) <= set(mine.table_ids) and second.reused_from
    assert kitchen.clear_leftovers(set(second.table_ids)) == 2  # the second order's own leftovers
    assert kitchen.clear_leftovers({999_999}) == 0  # nobody else's were touched
    third = next(e for e in cook(kitchen, RequestGroup(kitchen, prompts(2, 30), 2, seed=0, reuse_prefix=True))
                 if isinstance(e, Done)).result  # fmt: skip
    assert third.reused_tokens == 0


def test_the_inspector_names_the_class_before_advice_when_others_shared_the_steps(kitchen):
    other = kitchen.submit(list(range(7, 27)), 40, seed=1, reuse_prefix=False)  # a student's stream
    events = cook(kitchen, RequestGroup(kitchen, prompts(1, 20), 16, seed=0, reuse_prefix=False))
    result = next(e for e in events if isinstance(e, Done)).result
    share = class_share(result.trace.decode_steps)
    assert share.shared == share.steps == 15 and share.mostly
    verdict = diagnose(result.metrics, result.trace)
    assert verdict.headline.startswith("15 of 15 steps also cooked other orders")
    assert "the class, not your order, set this TPOT" in verdict.headline
    assert verdict.fixes[0].startswith("Cook the same order again when the class")
    kitchen.cancel(other)
    alone = next(e for e in cook(kitchen, RequestGroup(kitchen, prompts(1, 20), 8, seed=0, reuse_prefix=False))
                 if isinstance(e, Done)).result  # fmt: skip
    assert class_share(alone.trace.decode_steps).shared == 0
    assert "other orders" not in diagnose(alone.metrics, alone.trace).headline


def test_generated_prompts_end_where_a_word_ends(kitchen):
    """The reply never finishes the prompt's last word: the filler token after each cut starts a word."""
    ids, starts = filler_words(kitchen, FILLER)
    assert starts == word_starts(ids, kitchen.decode) and 0 < sum(starts) < len(ids)
    size = len(ids)
    for n in (5, 31, 64, 200):
        for prompt in generated_prompts(ids, n, 4, starts):
            assert len(prompt) == n
            start = next(s for s in range(size) if all(ids[(s + i) % size] == t for i, t in enumerate(prompt)))
            nxt = ids[(start + n) % size]
            shown, more = kitchen.decode(prompt), kitchen.decode([*prompt, nxt])
            after = more[len(shown):len(shown) + 1]
            assert shown[-1:].isspace() or not after.isalnum(), (n, shown[-20:], after)
    cut = generated_prompts(ids, 31, 4)  # without the word starts: some cut falls inside a word
    assert any(kitchen.decode([*p, ids[(ids.index(p[0]) + 31) % size]])[len(kitchen.decode(p)):][:1].isalnum()
               and not kitchen.decode(p)[-1:].isspace() for p in cut)
