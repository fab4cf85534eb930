"""A Kitchen order outlives its engine process: the fresh process goes on from the tokens already
served (engine/request_group.py `OrderResume`, serving/host/recovery.py `HeardOrder`), the page
gets a `Restart` event instead of an error, and the answer is the one the order would have had.

First on two real chef engines in this process (the first one simply dropped mid-order, as a
killed process would be), then through the host's real engine process, killed with SIGKILL
mid-order, and with a poison order beside a good one (the hung engine's path is in
tests/test_loop_watchdog.py). Batch-invariant mode makes a resumed table's recomputed prompt the
same bits as the tokens it decoded (serving/host/recovery.py says what holds without it).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from engine import Engine
from engine.events import Done, PrefillStart, Restart, StepEnd, Token
from engine.request_group import RequestGroup
from engine.settings import EngineSettings
from serving.host import wire
from serving.host.api import CheckedOrder, OrderForm
from serving.host.loop import POISON_ENV, TEST_HANG_ENV, LoopSettings
from serving.host.process import EngineProcess
from serving.host.recovery import HeardOrder, Recovery, poison_line

SETTINGS = EngineSettings(policy="chunked", token_budget=64, batch_invariant=True)
PROMPTS = ["ROMEO:\nO she doth", "JULIET:\nWherefore art thou", [5, 17, 300, 41]]
MAX_STEPS = 5000


def engine() -> Engine:
    return Engine.load("chef", SETTINGS)


def cook(eng: Engine, order: RequestGroup, heard: HeardOrder | None = None, until_pot: int | None = None) -> list:
    """Step until the order is done (or has had `until_pot` pot passes); its events, folded into `heard`."""
    events = []
    for _ in range(MAX_STEPS):
        if order.done or (until_pot is not None and sum(is_pot(e) for e in events) >= until_pot):
            return events
        taken = order.take(eng.step())
        if heard is not None:
            heard.fold(taken)
        events += taken
    raise AssertionError("the order did not finish")


def is_pot(ev) -> bool:
    return isinstance(ev, StepEnd) and ev.step.phase == "decode"


def result_of(events: list):
    return next(e.result for e in events if isinstance(e, Done))


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "top_k": 40, "seed": 11}],
                         ids=["greedy", "sampled"])  # fmt: skip
def test_a_resumed_order_ends_as_the_uninterrupted_one(sampling):
    max_new = 24
    whole = result_of(cook(eng := engine(), RequestGroup(eng, PROMPTS, max_new, **sampling)))

    first = engine()
    heard = HeardOrder(len(PROMPTS))
    before = cook(first, RequestGroup(first, PROMPTS, max_new, **sampling), heard, until_pot=7)
    del first  # the process died: nothing of it is left but what the host heard
    assert [len(t) for t in heard.tokens] == [8, 8, 8] and heard.started and not any(heard.finished)

    fresh = engine()
    resumed = RequestGroup(fresh, PROMPTS, max_new, resume=heard.resume(1), **sampling)
    after = cook(fresh, resumed)
    res = result_of(after)
    assert res.tokens == whole.tokens and res.texts == whole.texts
    assert res.prompt_ids == whole.prompt_ids  # the order's own prompts, not prompt + served tokens
    assert not any(isinstance(e, PrefillStart) for e in after)  # the page was told of the wok once
    for table in range(len(PROMPTS)):  # each table's token indices count on across the restart
        steps = [e.step for e in before + after if isinstance(e, Token) and e.seq == table]
        assert steps == list(range(max_new))
    # TTFT is the one the page saw; the restart's pass is one more gap between tokens; the clock goes on
    assert res.metrics.ttft_s == heard.steps[0].t_end == res.trace.t_first_token
    assert len(res.metrics.itl_s) == max_new - 1 and len(res.trace.steps) == max_new
    assert after[0].t >= before[-1].t and res.metrics.e2e_s > heard.steps[-1].t_end
    assert any("restarted 1 time while this order cooked" in n and "24 tokens" in n for n in res.trace.notes)


def test_a_table_that_had_finished_is_not_cooked_again():
    max_new = 12
    whole = result_of(cook(eng := engine(), RequestGroup(eng, PROMPTS[:2], max_new)))
    heard = HeardOrder(2)
    heard.tokens = [whole.tokens[0][:5], list(whole.tokens[1])]  # table 1 had all its tokens when the process died
    heard.finished = ["", "served"]
    heard.steps = list(whole.trace.steps[:5])
    heard.started = True
    fresh = engine()
    resumed = RequestGroup(fresh, PROMPTS[:2], max_new, resume=heard.resume(1))
    assert len(resumed.rids) == 1  # only table 0 goes back on the stove
    res = result_of(cook(fresh, resumed))
    assert res.tokens == whole.tokens and res.texts == whole.texts


# -- through the host's engine process ---------------------------------------------------------------------


def drain_until_end(handle, timeout_s: float, kill_after_pot: int | None = None, kill=None) -> list:
    """A handle's items until its end; `kill()` once the order has had `kill_after_pot` pot passes."""
    deadline, items, pot = time.monotonic() + timeout_s, [], 0
    while time.monotonic() < deadline:
        for kind, value in handle.drain():
            items.append((kind, value))
            pot += kind == "events" and sum(is_pot(e) for e in value)
        if kill is not None and pot >= kill_after_pot:
            kill()
            kill = None
        if items and items[-1][0] in ("done", "error", "cancelled"):
            return items
        time.sleep(0.005)
    raise AssertionError(f"no end within {timeout_s} s: {items[-3:]}")


def events_of(items: list) -> list:
    return [e for kind, value in items if kind == "events" for e in value]


ORDER = CheckedOrder([[835, 26], [835, 26, 13], [5, 17, 300, 41]], 40, {"temperature": 0.0})


def test_an_order_goes_on_after_its_engine_process_is_killed(monkeypatch):
    monkeypatch.setenv(TEST_HANG_ENV, "0.03")  # every step told at once and 30 ms long: the kill lands mid-order
    process = EngineProcess(LoopSettings("chef", SETTINGS, threads=1))
    try:
        whole = result_of(events_of(drain_until_end(process.place_order(ORDER), 120)))
        first_pid = process.pid
        items = drain_until_end(process.place_order(ORDER), 120, 5, lambda: os.kill(first_pid, signal.SIGKILL))
        assert items[-1] == ("done", None), items[-1]
        events = events_of(items)
        (mark,) = [e for e in events if isinstance(e, Restart)]
        assert "stopped (exit code -9)" in mark.why and "\n" not in mark.why
        assert 5 * 3 <= mark.kept < 40 * 3  # every table had tokens, none had all
        res = result_of(events)
        assert res.tokens == whole.tokens and res.texts == whole.texts
        assert any("restarted 1 time" in n for n in res.trace.notes)
        assert process.restarts == 1 and process.pid != first_pid and process.recovery.resumed == 1
        assert len([e for e in events if isinstance(e, PrefillStart)]) == 1
    finally:
        process.close()


def test_a_poison_order_ends_alone_in_one_line_and_its_neighbour_goes_on(monkeypatch):
    monkeypatch.setenv(POISON_ENV, "kill:Wherefore")
    process = EngineProcess(LoopSettings("chef", SETTINGS, threads=1))
    try:
        ids = process.check(OrderForm(["JULIET:\nWherefore art thou"], 16)).result(60)
        good = process.place_order(ORDER)
        poison = process.place_order(CheckedOrder(ids, 16, {}))
        bad_items = drain_until_end(poison, 120)
        good_items = drain_until_end(good, 120)
        assert bad_items[-1][0] == "error" and "\n" not in bad_items[-1][1]
        assert bad_items[-1][1].startswith(poison_line("chef", "")[:60])
        assert process.restarts == 2 and process.recovery.poisoned == 1
        # the good order was in flight at the first crash at least; it went on each time and ended whole
        assert good_items[-1] == ("done", None)
        assert 1 <= len([e for e in events_of(good_items) if isinstance(e, Restart)]) <= 2
        monkeypatch.delenv(POISON_ENV)
        whole = result_of(events_of(drain_until_end(process.place_order(ORDER), 120)))
        assert result_of(events_of(good_items)).tokens == whole.tokens
    finally:
        process.close()


def test_a_request_waiting_its_turn_is_not_blamed_for_a_crash_it_was_not_in():
    recovery = Recovery()
    for key in ("r1", "r2"):
        recovery.track(wire.Submit(key, "ROMEO:", 8, {}))
    first = recovery.crashed(["r1", "r2"], "killed")  # neither had a token: both blamed once, none resumed at once
    assert first.now == [] and first.poisoned == []
    assert recovery.next_probe() == "r1"  # r1 goes back alone; r2 waits for it to stream a token
    second = recovery.crashed(["r1", "r2"], "killed again")  # r1 crashed the fresh engine too
    assert second.poisoned == ["r1"] and recovery.poisoned == 1
    assert recovery.next_probe() == "r2" and recovery.waiting() == 0  # r2 was never blamed twice
