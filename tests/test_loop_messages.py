"""The kitchen loop's protocol (serving/loop_messages.py): each side has exactly one handler per
message the other side sends, so a new message cannot be sent without being handled."""

from __future__ import annotations

import pickle

from serving.engine_client import EngineClient
from serving.kitchen_loop import Loop
from serving.loop_messages import TO_HOST, TO_LOOP, Answer, PlaceOrder, Stop


def test_the_loop_handles_every_message_of_the_host_but_stop_which_ends_it():
    assert set(Loop(conn=None, engine=None).handlers) == set(TO_LOOP) - {Stop}


def test_the_host_handles_every_message_of_the_loop():
    assert set(EngineClient.__new__(EngineClient).handlers()) == set(TO_HOST)


def test_messages_travel_as_plain_values():
    for msg in (PlaceOrder("o1", ["ROMEO:", [1, 2]], 8, {"temperature": 0.0, "seed": 0}), Answer("a1", False, "no")):
        assert pickle.loads(pickle.dumps(msg)) == msg
