"""A host's loop that is alive but silent is stopped after its limit and replaced; its order goes on.

The child here is the real loop on the embedded chef, made to hang for real by its test hook
(`TWO_POT_TEST_HANG_S`: a pause after every step, far past the watchdog's limit, which
`TWO_POT_SILENCE_S` lowers for the test). The replacement child starts without the hook and cooks.
"""

from __future__ import annotations

import re
import time

import pytest

from engine.events import Restart, Token
from engine.settings import EngineSettings
from serving.host.api import CheckedOrder
from serving.host.loop import TEST_HANG_ENV, LoopSettings
from serving.host.process import EngineProcess
from serving.host.watchdog import SILENCE_ENV, hung_line, silence_limit_s

SETTINGS = LoopSettings("chef", EngineSettings(policy="chunked", token_budget=64), threads=1)
ROMEO = [[835, 26]]  # "ROMEO:" in the chef's tokens: an order's checked ids


def test_the_silence_limit_is_a_floor_or_a_multiple_of_the_longest_step():
    assert silence_limit_s(0.4, floor_s=60) == 60
    assert silence_limit_s(5.0, floor_s=60) == 100  # a slow model's big prompt pass: 20 x 5 s
    line = hung_line("chef", 3)
    assert "\n" not in line and "sent nothing for 3 s (the limit for this order)" in line and "restarts it" in line


def drain_until_end(handle, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    items = []
    while time.monotonic() < deadline:
        items += handle.drain()
        if items and items[-1][0] in ("done", "error", "cancelled"):
            return items
        time.sleep(0.05)
    raise AssertionError(f"no end within {timeout_s} s: {items[-3:]}")


def test_a_silent_loop_is_stopped_at_its_limit_and_its_order_goes_on_in_the_fresh_one(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "3")
    monkeypatch.setenv(TEST_HANG_ENV, "120")  # the first child pauses 120 s after every step
    process = EngineProcess(SETTINGS)
    monkeypatch.delenv(TEST_HANG_ENV)  # the replacement child behaves
    try:
        first_pid = process.pid
        t0 = time.monotonic()
        hung = drain_until_end(process.place_order(CheckedOrder(ROMEO, 8, {"temperature": 0.0})), 60)
        took = time.monotonic() - t0
        assert hung[-1] == ("done", None), hung[-1]  # not an error: the fresh child finished it
        (mark,) = [e for kind, value in hung if kind == "events" for e in value if isinstance(e, Restart)]
        assert "\n" not in mark.why and mark.kept == 1  # the wok's first bowl was out when the loop went silent
        found = re.search(r"sent nothing for ([\d,]+) s \(the limit for this order\)", mark.why)
        assert found and int(found.group(1)) == 3 and "hung" in mark.why and "restarts it" in mark.why, mark.why
        assert took < 60  # stopped at its limit, not after the 120 s pause
        assert process.restarts == 1 and process.pid != first_pid
        fresh = drain_until_end(process.place_order(CheckedOrder(ROMEO, 8, {"temperature": 0.0})), 120)
        tokens = [[e.token_id for kind, v in items if kind == "events" for e in v if isinstance(e, Token)]
                  for items in (hung, fresh)]  # fmt: skip
        assert len(tokens[0]) == 8 and fresh[-1] == ("done", None) and process.restarts == 1
    finally:
        process.close()


def test_an_idle_loop_is_never_called_hung(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "2")
    process = EngineProcess(SETTINGS)
    try:
        time.sleep(3)  # silent with nothing in flight: past the limit
        assert process.restarts == 0
        placed = process.place_order(CheckedOrder(ROMEO, 4, {"temperature": 0.0}))
        assert drain_until_end(placed, 60)[-1][0] == "done" and process.restarts == 0
    finally:
        process.close()


def test_a_loop_that_dies_before_it_is_ready_is_a_load_error_in_one_line():
    with pytest.raises(Exception, match="could not load no-such-model") as err:
        EngineProcess(LoopSettings("no-such-model"))
    assert "\n" not in str(err.value)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
