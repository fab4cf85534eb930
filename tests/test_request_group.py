"""One Kitchen order in a shared kitchen (engine/request_group.py) and its events on the wire
(serving/host/wire.py), on the real chef engine: no server, no threads."""

from __future__ import annotations

import json

import pytest
from conftest import CHEF_CONTEXT

from engine.errors import EngineError
from engine.events import Done, PrefillEnd, PrefillStart, StepEnd, Token
from engine.request_group import RequestGroup, shared_check, shared_limits
from serving.host.wire import from_json, to_json

PROMPTS = ["ROMEO:\nO she doth", "JULIET:\nWherefore art thou", [5, 17, 300, 41]]  # text and token ids
MAX_STEPS = 5000  # bounds every loop that steps the engine


@pytest.fixture(scope="module")
def eng():
    from engine import Engine

    return Engine.load("chef", policy="chunked", token_budget=64, max_seqs=16)


@pytest.fixture(scope="module")
def ref():
    """A second engine for the answers alone (its own fixed batch, never the shared kitchen's seats)."""
    from engine import Engine

    return Engine.load("chef")


@pytest.fixture
def kitchen(eng):
    """The shared engine, idle before the test and drained after it."""
    drain(eng)
    yield eng
    drain(eng)


def drain(eng) -> list:
    events = []
    for _ in range(MAX_STEPS):
        if eng.idle:
            return events
        events += eng.step()
    raise AssertionError("the engine did not become idle")


def cook(eng, order: RequestGroup, raw: list | None = None) -> list:
    """Step the engine until the order is done; returns the order's events (`raw` gets every step's)."""
    out = []
    for _ in range(MAX_STEPS):
        if order.done:
            return out
        events = eng.step()
        if raw is not None:
            raw.append(events)
        out += order.take(events)
    raise AssertionError("the order did not finish")


def result_of(events: list):
    done = [e for e in events if isinstance(e, Done)]
    assert len(done) == 1 and events[-1] is done[0]
    return done[0].result


def check_story(events: list, res, n_tables: int) -> None:
    """The order's events tell the story the Kitchen draws, table by table. (A wok of several passes
    lets a table that got its first token early ladle on before PrefillEnd: only Tokens come between.)"""
    assert isinstance(events[0], PrefillStart)
    start, end = events[0], next(i for i, e in enumerate(events) if not isinstance(e, (PrefillStart, Token)))
    assert isinstance(events[end], PrefillEnd) and sum(isinstance(e, (PrefillStart, PrefillEnd)) for e in events) == 2
    assert start.batch == n_tables and start.prompt_tokens == res.prompt_tokens and start.mode == "packed"
    assert start.slots == sum(res.prompt_tokens)
    for i in range(n_tables):
        toks = [e for e in events if isinstance(e, Token) and e.seq == i]
        assert [e.token_id for e in toks] == res.tokens[i]
        assert [e.step for e in toks] == list(range(len(res.tokens[i])))
        assert [e.finished for e in toks] == [False] * (len(toks) - 1) + [True]
        assert "".join(e.text for e in toks) == res.texts[i]
    assert {e.seq for e in events if isinstance(e, Token)} == set(range(n_tables))
    ends = [e.step for e in events if isinstance(e, StepEnd)]
    assert ends == res.trace.steps  # one StepEnd per traced record, in order
    assert events[end].step == res.trace.steps[0] and events[end].kv_bytes == res.trace.steps[0].kv_bytes
    times = [e.t for e in events]
    assert 0 <= start.t < events[end].t and times == sorted(times)


def check_trace_and_metrics(res, n_tables: int, max_new: int) -> None:
    steps = res.trace.steps
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * (len(steps) - 1)
    assert [s.index for s in steps] == list(range(len(steps)))
    assert all(a.t_end <= b.t_start for a, b in zip(steps, steps[1:], strict=False))
    m, tr = res.metrics, res.trace
    assert m.ttft_s == tr.t_first_token == steps[0].t_end > 0
    assert m.e2e_s == tr.t_done == steps[-1].t_end
    n = max(map(len, res.tokens))
    assert n == max_new and m.tpot_s == pytest.approx((m.e2e_s - m.ttft_s) / (n - 1)) and m.tpot_s > 0
    assert m.output_tokens == sum(map(len, res.tokens)) == n_tables * max_new
    assert m.prefill_tokens == steps[0].tokens >= sum(res.prompt_tokens)
    assert len(m.itl_s) == len(steps) - 1
    assert m.kv_cache_bytes == max(s.kv_bytes for s in steps) > 0
    assert res.path == "class kitchen" and res.model == "chef" and res.settings["max_new_tokens"] == max_new


def held_bytes(per_token: int, prompts: list[int], counts: list[int], finished_before: set[int]) -> int:
    """K/V the order's live tables hold after a pass: each its prompt + every token but the newest."""
    return per_token * sum(p + c - 1 for t, (p, c) in enumerate(zip(prompts, counts, strict=True))
                           if c and t not in finished_before)  # fmt: skip


def check_kv_is_the_orders_own(eng, events: list, res) -> None:
    """Every record's kv_bytes counts this order's tables only (after the pass, ended tables included)."""
    per = eng.info.kv_bytes_per_token
    counts, finished_before, ended = [0] * len(res.tokens), set(), set()
    records = []
    for e in events:
        if isinstance(e, Token):
            counts[e.seq] += 1
            if e.finished:
                ended.add(e.seq)
        elif isinstance(e, StepEnd):
            records.append(e.step)
            assert e.step.kv_bytes == held_bytes(per, res.prompt_tokens, counts, finished_before), e.step
            finished_before |= ended
    assert len(records) == len(res.trace.steps)


# -- an order alone, and an order in a busy kitchen ---------------------------------------------------------------


def test_an_order_alone_equals_generate_and_tells_its_story(kitchen, ref):
    max_new = 8
    expected = ref.generate(PROMPTS, max_new_tokens=max_new)
    order = RequestGroup(kitchen, PROMPTS, max_new, order_id=7)
    raw: list = []
    events = cook(kitchen, order, raw)
    res = result_of(events)
    assert res.tokens == expected.tokens and res.texts == expected.texts
    assert res.prompt_ids == expected.prompt_ids and res.request_id == 7
    assert all(e.request_id == 7 for e in events)
    check_story(events, res, len(PROMPTS))
    check_trace_and_metrics(res, len(PROMPTS), max_new)
    assert len(res.trace.steps) == max_new and res.trace.notes == []  # one wok pass, then a pot step per token
    assert isinstance(events[1], PrefillEnd) and res.metrics.prefill_tokens == sum(res.prompt_tokens)
    check_kv_is_the_orders_own(kitchen, events, res)
    # alone in the kitchen, the order holds every K/V of each pass (the last one too)
    passes = [next(e for e in step if isinstance(e, StepEnd)) for step in raw if step]
    assert [p.step.kv_bytes for p in passes] == [s.kv_bytes for s in res.trace.steps]
    assert [p.step.batch for p in passes] == [len(PROMPTS)] * max_new
    assert kitchen.idle


def test_an_order_joining_a_busy_kitchen_equals_generate(kitchen, ref):
    max_new = 6
    others = ["KING:\nWhat news", [9, 8, 7, 6, 5, 4, 3]]
    alone_others = [ref.generate([p], max_new_tokens=20).tokens[0] for p in others]
    expected = ref.generate(PROMPTS, max_new_tokens=max_new)
    rids = [kitchen.submit(p, 20) for p in others]
    before = []
    for _ in range(3):
        before += kitchen.step()
    assert any(isinstance(e, Token) for e in before)  # the others are decoding when the order arrives
    order = RequestGroup(kitchen, PROMPTS, max_new, order_id=3)
    raw: list = []
    events = cook(kitchen, order, raw)
    res = result_of(events)
    assert res.tokens == expected.tokens  # the order in a busy batch == the order alone
    check_story(events, res, len(PROMPTS))
    check_trace_and_metrics(res, len(PROMPTS), max_new)
    check_kv_is_the_orders_own(kitchen, events, res)
    # the order's records are the passes it shared: the whole pass's batch, but only its own K/V
    ends = [next(e for e in step if isinstance(e, StepEnd)) for step in raw if step]
    shared = [p for p in ends if set(order.rids) & set(p.request_ids)]
    assert [p.step.batch for p in shared] == [s.batch for s in res.trace.steps]
    assert all(s.batch == len(PROMPTS) + len(others) for s in res.trace.steps)
    assert all(s.kv_bytes < p.step.kv_bytes for s, p in zip(res.trace.steps, shared, strict=True))
    assert all(s.forward_s == p.step.forward_s for s, p in zip(res.trace.steps, shared, strict=True))
    # the neighbours' tokens are not the order's, and theirs equal their answers alone
    rest = before + [e for step in raw for e in step] + drain(kitchen)
    done = {e.request_id: e.result for e in rest if isinstance(e, Done)}
    assert [done[r].tokens for r in rids] == alone_others
    assert sum(isinstance(e, Token) for e in events) == len(PROMPTS) * max_new


def test_prompts_over_the_token_budget_fold_into_one_prefill_record(kitchen, ref):
    prompts = [list(range(1, 100))] * 3  # 297 prompt tokens; a pass computes at most 64
    expected = ref.generate(prompts, max_new_tokens=4)
    order = RequestGroup(kitchen, prompts, 4)
    raw: list = []
    events = cook(kitchen, order, raw)
    res = result_of(events)
    assert res.tokens == expected.tokens
    check_story(events, res, 3)
    check_trace_and_metrics(res, 3, 4)
    check_kv_is_the_orders_own(kitchen, events, res)
    wok = res.trace.steps[0]
    passes = [next(e for e in step if isinstance(e, StepEnd)) for step in raw if step]
    n_wok = 1 + next(i for i, p in enumerate(passes) if p.step.t_end - order.t0 == wok.t_end)
    assert n_wok >= 297 // 64 + 1  # several passes ...
    assert [s.phase for s in res.trace.steps].count("prefill") == 1  # ... one record
    assert wok.tokens == sum(p.step.tokens for p in passes[:n_wok]) >= 297
    assert wok.forward_s == pytest.approx(sum(p.step.forward_s for p in passes[:n_wok]))
    assert wok.t_start == passes[0].step.t_start - order.t0 and wok.flops > passes[0].step.flops
    assert len(res.trace.notes) == 1 and f"took {n_wok} passes" in res.trace.notes[0]
    assert res.metrics.ttft_s == wok.t_end and res.metrics.prefill_s == pytest.approx(wok.t_end - wok.t_start)
    # a table that got its first token early ladled more while the others were still in the wok
    first = [next(e for e in events if isinstance(e, Token) and e.seq == i) for i in range(3)]
    assert first[0].t < first[2].t <= wok.t_end + 1e-9


def test_tables_waiting_for_a_seat_still_get_their_answers(ref):
    from engine import Engine

    small = Engine.load("chef", policy="chunked", token_budget=64, max_seqs=4)
    prompts = [f"CITIZEN {i}:" for i in range(6)]
    expected = ref.generate(prompts, max_new_tokens=3)
    order = RequestGroup(small, prompts, 3)
    res = result_of(cook(small, order))
    assert res.tokens == expected.tokens
    assert res.trace.steps[0].batch == 4 and "passes" in res.trace.notes[0]  # two tables waited for a seat
    assert small.idle


def test_cancel_ends_the_order_without_done_and_frees_its_tables(kitchen):
    other = kitchen.submit("KING:", 30)
    order = RequestGroup(kitchen, PROMPTS, 200)
    events = []
    for _ in range(4):
        events += order.take(kitchen.step())
    assert any(isinstance(e, Token) for e in events) and not order.done
    order.cancel()
    events += order.take(kitchen.step())
    assert order.done and order.cancelled
    assert not any(isinstance(e, Done) for e in events)
    assert all(rid not in kitchen.serving.seqs for rid in order.rids)
    assert set(kitchen.serving.seqs) == {other}  # the neighbour cooks on
    assert order.take(kitchen.step()) == []  # nothing more is the order's
    drain(kitchen)
    assert kitchen.idle


# -- refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompts, max_new, settings, words",
    [
        (["hi"], 8, {"cache": "none"}, "setting 'cache' does not apply to an order in a shared kitchen"),
        (["hi"], 8, {"speculate": 2}, "setting 'speculate'"),
        (["hi", [7] * (CHEF_CONTEXT - 10)], 20, {}, "exceeds the model's context of"),
        (["hi"], CHEF_CONTEXT + 88, {}, "context of"),
        ([], 8, {}, "no prompts given"),
        (["hi", ""], 8, {}, "prompt 2 is empty"),
        ([[1, 99999]], 4, {}, "token id 99999"),
        (["hi"], 0, {}, "max_new_tokens must be at least 1"),
        (["hi"], 8, {"temperature": -1}, "temperature"),
    ],
)
def test_refusals_are_one_line_and_leave_nothing_in_the_kitchen(kitchen, prompts, max_new, settings, words):
    for attempt in (lambda: shared_check(kitchen, prompts, max_new, **settings),
                    lambda: RequestGroup(kitchen, prompts, max_new, **settings)):  # fmt: skip
        with pytest.raises(EngineError) as err:
            attempt()
        assert words in str(err.value) and "\n" not in str(err.value)
        assert kitchen.idle and not kitchen.serving.seqs


def test_a_table_refused_at_submit_takes_the_whole_order_out(kitchen, monkeypatch):
    real, calls = kitchen.submit, []

    def submit(prompt, max_new_tokens, **kw):
        calls.append(prompt)
        if len(calls) == 3:
            raise EngineError("the third table does not fit")
        return real(prompt, max_new_tokens, **kw)

    monkeypatch.setattr(kitchen, "submit", submit)
    with pytest.raises(EngineError, match="the third table"):
        RequestGroup(kitchen, PROMPTS, 8)
    events = kitchen.step()  # the two accepted tables leave at the next step, cancelled, without cooking
    assert sorted(e.result.finish_reason for e in events if isinstance(e, Done)) == ["cancelled", "cancelled"]
    assert not any(isinstance(e, (Token, StepEnd)) for e in events)
    assert kitchen.idle


def test_shared_check_returns_the_ids_and_limits_follow_the_kitchen(kitchen):
    ids = shared_check(kitchen, ["ROMEO:", [1, 2, 3]], 8, temperature=0.5, seed=3)
    assert ids == [kitchen.encode("ROMEO:"), [1, 2, 3]]
    lim, srv = shared_limits(kitchen, 100, 64), kitchen.serving_limits()
    per = kitchen.info.kv_bytes_per_token
    kv_tokens = kitchen.serving.scheduler.kv_tokens
    assert lim.kv_bytes_per_token == per and lim.kv_bytes_per_sequence == 164 * per
    assert lim.max_batch == min(srv.seats, kv_tokens // 164) == 16  # the seats bind here
    # a seat holds prompt + new tokens - 1 (the last token is never fed back)
    assert lim.max_context == min(kitchen.cfg.max_context, srv.seat_len + 1) <= CHEF_CONTEXT == kitchen.cfg.max_context
    assert lim.kv_budget_bytes == kv_tokens * per
    assert shared_limits(kitchen, 400, 100).max_batch == min(srv.seats, kv_tokens // 500)
    assert shared_limits(kitchen, 0, 0).kv_bytes_per_sequence == per  # never a zero-token seat


# -- the wire -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def order_events(eng):
    drain(eng)
    order = RequestGroup(eng, [list(range(1, 80)), "ROMEO:"], 5, order_id=11, temperature=0.8, seed=4)
    raw: list = []
    events = cook(eng, order, raw)
    drain(eng)
    return events, [e for step in raw for e in step]


def test_every_event_survives_json_and_comes_back_equal(order_events):
    events, raw = order_events
    kinds = {type(e).__name__ for e in events}
    assert kinds == {"PrefillStart", "PrefillEnd", "Token", "StepEnd", "Done"}
    for ev in events + [e for e in raw if not isinstance(e, Done)]:  # the scheduler's StepEnds have request ids
        wire = json.loads(json.dumps(to_json(ev)))
        back = from_json(wire)
        assert type(back) is type(ev) and back == ev, wire["__t"]
    res = result_of(events)
    back = from_json(json.loads(json.dumps(to_json(events[-1])))).result
    assert back.tokens == res.tokens and back.metrics == res.metrics and back.trace.steps == res.trace.steps
    assert back.trace.notes == res.trace.notes and back.settings == res.settings and back.path == "class kitchen"
    assert back.trace.prefill == res.trace.prefill and back.metrics.itl_s == res.metrics.itl_s
    assert any(isinstance(e, StepEnd) and e.request_ids for e in raw)
    step_end = next(e for e in raw if isinstance(e, StepEnd) and e.request_ids)
    assert isinstance(from_json(json.loads(json.dumps(to_json(step_end)))).request_ids, tuple)


def test_the_wire_is_plain_json_tagged_with_the_events_type(order_events):
    events, _ = order_events
    token = next(e for e in events if isinstance(e, Token))
    d = to_json(token)
    assert d == {"__t": "Token", "t": token.t, "seq": token.seq, "step": token.step, "token_id": token.token_id,
                 "text": token.text, "finished": token.finished, "request_id": 11,
                 "logprob": None, "top_logprobs": {"__tuple__": []}}  # fmt: skip  (an order asks for no logprobs)
    done = to_json(events[-1])
    assert done["__t"] == "Done" and done["result"]["path"] == "class kitchen"
    assert done["result"]["trace"]["notes"] == events[-1].result.trace.notes
    assert [to_json(e)["__t"] for e in events[:2]] == ["PrefillStart", "PrefillEnd"]


@pytest.mark.parametrize(
    "d, words",
    [
        ({"__t": "Token", "t": 1.0}, "a malformed Token"),
        ({"__t": "PrefillEnd", "t": 1.0, "kv_bytes": 0}, "a malformed PrefillEnd"),
        ({"__t": "Done", "t": 0.0}, "a malformed Done"),
        ({"__t": "Done", "t": 0.0, "result": {"__t": "GenerationResult", "tokens": []}}, "a malformed GenerationResult"),
        ({"__t": "Soup", "t": 0.0}, "'Soup' is not a type this side knows"),
    ],
)
def test_the_wire_refuses_what_it_cannot_read(d, words):
    with pytest.raises(ValueError) as err:
        from_json(d)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_sampled_order_in_the_shared_kitchen_equals_generate(order_events, ref):
    """At temperature > 0 too: the class kitchen and `generate()` follow one sampling rule (table i:
    seed + i), so the same seeded order gets the same text in both."""
    res = result_of(order_events[0])
    expected = ref.generate([list(range(1, 80)), "ROMEO:"], max_new_tokens=5, temperature=0.8, seed=4)
    assert res.tokens == expected.tokens and res.texts == expected.texts
    assert expected.path == "seats" and res.path == "class kitchen"
