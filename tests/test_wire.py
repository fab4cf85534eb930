"""Everything on a host's pipe (serving/host/wire.py): each side has exactly one handler per message
the other side sends, every message crosses as one JSON object through the one codec (never pickle),
and a type is rebuilt only from the registry: nothing a message says imports code or changes the
import path."""

from __future__ import annotations

import ast
import json

import pytest

from engine.events import Token
from engine.results import RequestMetrics, RequestOutput
from engine.serving_core import ServingLimits
from lab.padding import PaddingSettings
from lab.registry import LabRun  # noqa: F401 -- registers the Lab's types with the wire
from serving.host import wire as m
from serving.host.api import OrderForm
from serving.host.loop import Loop
from serving.host.process import EngineProcess
from tests.test_import_graph import ROOT, project_files

PIPE_FILES = ("serving/host/process.py", "serving/host/loop.py", "serving/host/wire.py")

RESULT = RequestOutput(3, [1, 2], [5, 6], " the", "length", RequestMetrics(0.0, 0.01, 0.002, [0.002], 0.012, 2, 2, 0, 0))
STEP = m.StepInfo(4, "decode", 0.003, 2, 0, 2, 4096, ("r1", "o2/0"), 1.7e9)
TOKEN = ("r1", 42, " the", 0, False, 0.011, (" the", -0.5, ((" a", -1.25), (" an", -2.0))))
ORDER_EVENTS = [Token(0.01, 0, 1, 7, "a", False, 0, -0.25, ((7, -0.25), (9, -1.5)))]


def ready_info():
    from engine.loader import ModelInfo

    info = ModelInfo("chef", "llama", 1, 2, 3, 4, 4, 8, 65, 256, 10, 6144, True, "cpu", "float32", True)
    return m.ReadyInfo("chef", "cpu", "float32", "chunked", 256, 65, None, "", "\n", 1.5, info,
                       ServingLimits(8, 256, 2048, 1, 2, 3), 64)  # fmt: skip


EXAMPLES = [
    m.Submit("r1", "ROMEO:", 8, {"temperature": 0.7, "seed": 3, "stop": ("\n",)}),
    m.Check("c1", OrderForm([], 8, {"temperature": 0.0, "seed": 0, "reuse_prefix": False}, "FIRST COOK:", 4, 32)),
    m.PlaceOrder("o1", [[5, 6], [1, 2]], 8, {"temperature": 0.0, "seed": 0, "reuse_prefix": False}),
    m.RunSweep("s1", "padding", PaddingSettings()),
    m.Cancel("o1"),
    m.Stop(),
    m.Ready(ready_info()),
    m.LoadError("could not load nope: no such model"),
    m.Accepted("r1", 6),
    m.OrderAccepted("o1", [6, 2]),
    m.Checked("c1", [[1, 2, 3], [4, 5, 6]]),
    m.Refusal("r2", "the prompt is longer than the context (256 tokens)"),
    m.SweepProgress("s1", PaddingSettings(lengths=(8, 16))),
    m.SweepDone("s1", True, {"points": [(1, 2.5)], "note": "measured", 3: float("inf")}),
    m.Steps([m.StepNews(STEP, [TOKEN], [("r1", RESULT)], m.QueueState(1, 0, 0.25, 10, 4), [("o2", ORDER_EVENTS, None)]),
             m.StepNews(None, [], [], m.QueueState(0, 0, 0.0), [("o2", [], "cancelled")])]),
]


def test_the_loop_handles_every_message_of_the_host_but_stop_which_ends_it():
    assert set(Loop(conn=None, engine=None).handlers) == set(m.TO_LOOP) - {m.Stop}


def test_the_host_handles_every_message_of_the_loop():
    assert set(EngineProcess.__new__(EngineProcess).handlers()) == set(m.TO_HOST)


def test_every_message_class_round_trips_as_one_json_object():
    assert {type(x) for x in EXAMPLES} == set(m.TO_LOOP) | set(m.TO_HOST)
    for msg in EXAMPLES:
        raw = m.encode(msg)
        assert json.loads(raw)["__t"] == type(msg).__name__  # plain JSON, tagged with its registered type
        assert m.decode(raw) == msg, type(msg).__name__


def test_only_registered_types_are_rebuilt_and_nothing_is_imported_by_name():
    for bad in ({"__t": "os:system"}, {"__t": "system"}, {"__t": "lab.padding:PaddingSettings"},
                {"__t": "NoSuchThing"}, {"__t": "dict"}):  # fmt: skip
        with pytest.raises(ValueError, match="not a type this side knows"):
            m.from_json(bad)
    with pytest.raises(TypeError, match="not a registered type"):
        m.to_json(object())
    with pytest.raises(TypeError, match="is not a message"):
        m.encode(PaddingSettings())
    with pytest.raises(ValueError, match="not a message"):
        m.decode(json.dumps(m.to_json(PaddingSettings())).encode())
    assert m.from_json(m.to_json({"a": (1, 2.5, None), 3: [True]})) == {"a": (1, 2.5, None), 3: [True]}


def test_the_pipe_has_one_codec_and_nothing_on_it_is_pickled():
    for path in PIPE_FILES:
        tree = ast.parse((ROOT / path).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                    for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}  # fmt: skip
        assert not {"pickle", "cloudpickle", "dill"} & imported, path
        calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert not {"send", "recv"} & calls, f"{path}: Connection.send/recv pickle; use send_bytes/recv_bytes"
    codecs = [p.relative_to(ROOT).as_posix() for p in project_files() if p.parts[len(ROOT.parts)] == "serving"
              and {"to_json", "from_json", "encode", "decode"} & {f.name for f in ast.walk(ast.parse(p.read_text()))
                                                                   if isinstance(f, ast.FunctionDef)}]  # fmt: skip
    assert codecs == ["serving/host/wire.py"]


def test_no_code_changes_the_import_path_or_imports_by_name():
    """The run-time edges an import test cannot see: `sys.path` edits and `importlib` lookups."""
    bad = []
    for path in project_files():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(("serving/", "lab/", "kitchen_viz/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if "importlib" in names:
                    bad.append(f"{rel}:{node.lineno} imports importlib")
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                    and node.value.id == "sys":  # fmt: skip
                bad.append(f"{rel}:{node.lineno} touches sys.path")
    assert not bad, "\n".join(bad)
