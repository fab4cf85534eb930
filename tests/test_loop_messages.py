"""The kitchen loop's protocol (serving/loop_messages.py): each side has exactly one handler per
message the other side sends, so a new message cannot be sent without being handled, and every
message crosses the pipe as one JSON object through one codec (never pickle)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from engine.results import RequestMetrics, RequestOutput
from lab.padding import PaddingSettings
from serving import loop_messages as m
from serving.engine_client import EngineClient
from serving.kitchen_loop import Loop

REPO = Path(__file__).resolve().parent.parent
PIPE_FILES = ("serving/engine_client.py", "serving/kitchen_loop.py", "serving/loop_messages.py")

RESULT = RequestOutput(3, [1, 2], [5, 6], " the", "length", RequestMetrics(0.0, 0.01, 0.002, [0.002], 0.012, 2, 2, 0, 0))
STEP = m.StepInfo(4, "decode", 0.003, 2, 0, 2, 4096, ("r1", "o2/0"), 1.7e9)
TOKEN = ("r1", 42, " the", 0, False, 0.011, (" the", -0.5, ((" a", -1.25), (" an", -2.0))))
ORDER_EVENTS = [{"type": "token", "t": 0.01, "seq": 0, "step": 1, "token_id": 7, "text": "a", "finished": False}]
EXAMPLES = [
    m.Submit("r1", "ROMEO:", 8, {"temperature": 0.7, "seed": 3, "stop": ("\n",)}),
    m.PlaceOrder("o1", ["ROMEO:", [1, 2]], 8, {"temperature": 0.0, "seed": 0, "reuse_prefix": False}),
    m.Ask("a1", "check", (["ROMEO:"], 4, {"temperature": 0.0})),
    m.RunSweep("s1", "lab.padding", "run", PaddingSettings(), ("/somewhere",)),
    m.Cancel("o1"),
    m.Stop(),
    m.Ready(m.ReadyInfo("chef", "cpu", "float32", "chunked", 256, 65, 8, 2048, None, "", "\n", 1.5, {"name": "chef"}, 64)),
    m.LoadError("could not load nope: no such model"),
    m.Accepted("r1", 6),
    m.OrderAccepted("o1", [6, 2]),
    m.Refusal("r2", "the prompt is longer than the context (256 tokens)"),
    m.AskReply("a1", True, {"max_batch": 8, "max_context": 256}),
    m.AskReply("a2", False, "no"),
    m.SweepProgress("s1", PaddingSettings(lengths=(8, 16))),
    m.SweepDone("s1", True, {"points": [(1, 2.5)], "note": "measured"}),
    m.Steps([(STEP, [TOKEN], [("r1", RESULT)], m.QueueState(1, 0, 0.25, 10, 4), [("o2", ORDER_EVENTS, None)]),
           (None, [], [], m.QueueState(0, 0, 0.0), [("o2", [], "cancelled")])]),
]


def test_the_loop_handles_every_message_of_the_host_but_stop_which_ends_it():
    assert set(Loop(conn=None, engine=None).handlers) == set(m.TO_LOOP) - {m.Stop}


def test_the_host_handles_every_message_of_the_loop():
    assert set(EngineClient.__new__(EngineClient).handlers()) == set(m.TO_HOST)


def test_every_message_class_round_trips_as_one_json_object():
    assert {type(x) for x in EXAMPLES} == set(m.TO_LOOP) | set(m.TO_HOST)
    for msg in EXAMPLES:
        raw = m.encode(msg)
        assert json.loads(raw)["type"] == type(msg).__name__  # plain JSON, named by its class
        assert m.decode(raw) == msg, type(msg).__name__


def test_nothing_on_the_pipe_is_pickled():
    for path in PIPE_FILES:
        tree = ast.parse((REPO / path).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                    for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}  # fmt: skip
        assert not {"pickle", "cloudpickle", "dill"} & imported, path
        calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert not {"send", "recv"} & calls, f"{path}: Connection.send/recv pickle; use send_bytes/recv_bytes"
