"""A kitchen loop that is alive but silent is stopped after its limit, in one line, and replaced.

The child here is the real kitchen loop on the embedded chef, made to hang for real by its test
hook (`TWO_POT_TEST_HANG_S`: a pause after every step, far past the watchdog's limit, which
`TWO_POT_SILENCE_S` lowers for the test). The replacement child starts without the hook and cooks.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from serving.engine_client import EngineClient, hung_line, silence_limit_s
from serving.loop_messages import SILENCE_ENV, TEST_HANG_ENV, LoopSettings


def test_the_silence_limit_is_a_floor_or_a_multiple_of_the_longest_step():
    assert silence_limit_s(0.4, floor_s=60) == 60
    assert silence_limit_s(5.0, floor_s=60) == 100  # a slow model's big prompt pass: 20 x 5 s
    line = hung_line("chef", 3)
    assert "\n" not in line and "sent nothing for 3 s (the limit for this order)" in line and "restarts it" in line


async def drain_until_end(handle, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    items = []
    while time.monotonic() < deadline:
        items += handle.drain()
        if items and items[-1][0] in ("done", "error", "cancelled"):
            return items
        await asyncio.sleep(0.05)
    raise AssertionError(f"no end within {timeout_s} s: {items[-3:]}")


def test_a_silent_loop_fails_its_order_in_one_line_and_the_fresh_one_cooks(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "3")
    monkeypatch.setenv(TEST_HANG_ENV, "120")  # the first child pauses 120 s after every step
    client = EngineClient(LoopSettings("chef", threads=1, token_budget=64))
    monkeypatch.delenv(TEST_HANG_ENV)  # the replacement child behaves
    try:
        first_pid = client.pid

        async def orders():
            t0 = time.monotonic()
            hung = await client.submit_order(["ROMEO:"], 8, {"temperature": 0.0})
            end = (await drain_until_end(hung, 60))[-1]
            took = time.monotonic() - t0
            fresh = await client.submit_order(["ROMEO:"], 8, {"temperature": 0.0})  # waits for the new child
            return end, took, await drain_until_end(fresh, 120)

        end, took, fresh = asyncio.run(orders())
        assert end[0] == "error" and "\n" not in end[1], end
        found = re.search(r"sent nothing for ([\d,]+) s \(the limit for this order\)", end[1])
        assert found and int(found.group(1)) == 3 and "hung" in end[1] and "restarts it" in end[1], end[1]
        assert took < 60  # stopped at its limit, not after the 120 s pause
        assert client.restarts == 1 and client.pid != first_pid
        assert fresh[-1][0] == "done" and any(kind == "events" for kind, _ in fresh)
    finally:
        client.close()


def test_an_idle_loop_is_never_called_hung(monkeypatch):
    monkeypatch.setenv(SILENCE_ENV, "2")
    client = EngineClient(LoopSettings("chef", threads=1, token_budget=64))
    try:
        time.sleep(3)  # silent with nothing in flight: past the limit
        assert client.restarts == 0

        async def one():
            h = await client.submit_order(["ROMEO:"], 4, {"temperature": 0.0})
            return await drain_until_end(h, 60)

        assert asyncio.run(one())[-1][0] == "done" and client.restarts == 0
    finally:
        client.close()


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
