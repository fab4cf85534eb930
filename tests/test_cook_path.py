"""One Cook, traced: the files it runs down to the forward pass are the ones docs/architecture.md lists.

The Kitchen page cooks once in AppTest, on the app's own kitchen (called in process, its engine in
its loop process), with a profiler on: in this process on the page's Cook calls (`start_cook`,
`release_cook`) and on the order's thread until the order has left for the engine; in the loop's
process (its test hook, `TWO_POT_TEST_TRACE`) from the order's question to the first forward pass.
Two lists come out and must equal the document's:

  the path     the files on the call stack whenever the Cook crosses a boundary (each message it
               puts on the pipe) and when the forward pass starts: the hops, at most 12;
  the helpers  every other project file those calls entered and returned from on the way.

The Cook asks the engine one question before the first pass (the order's check: its token ids)
and then sends the order: the host's pipe carried exactly one Check and one PlaceOrder.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path

import pytest
from app_kit import open_kitchen

from kitchen_viz import app_state
from serving.host.loop import TRACE_ENV
from serving.http import mounted

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("engine/", "serving/", "lab/", "kitchen_viz/")
MAX_PATH = 12

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def rel(filename: str) -> str | None:
    try:
        path = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return path if path.startswith(PACKAGES) else None


class Tracer:
    """A profiler on this process's threads: the Cook's calls on the page's thread, and the order's
    own thread from its start until the order has been sent to the engine (`place_order` returns)."""

    ROOTS = ("start_cook", "release_cook")

    def __init__(self):
        self.entered: list[str] = []
        self.path: list[str] = []
        self.local = threading.local()
        self.known: dict[str, str | None] = {}

    def file(self, code) -> str | None:
        if code.co_filename not in self.known:
            self.known[code.co_filename] = rel(code.co_filename)
        return self.known[code.co_filename]

    def stack(self, frame) -> list[str]:
        files = []
        while frame is not None:
            here = self.file(frame.f_code)
            if here is not None and here not in files:
                files.insert(0, here)
            frame = frame.f_back
        return files

    def profile(self, frame, event, arg) -> None:
        local, code = self.local, frame.f_code
        here = self.file(code)
        if here is None:
            return
        order_thread = threading.current_thread().name.startswith("order-")
        if event == "call" and not getattr(local, "depth", 0) and (code.co_name in self.ROOTS or order_thread) \
                and not getattr(local, "sent", False):  # fmt: skip
            local.depth = 0
            local.on = True
        if not getattr(local, "on", False):
            return
        if event == "call":
            local.depth = getattr(local, "depth", 0) + 1
            if here not in self.entered:
                self.entered.append(here)
            if (here, code.co_name) == ("serving/host/wire.py", "encode"):  # a message leaves for the engine
                self.path += [f for f in self.stack(frame) if f not in self.path]
        elif event == "return":
            local.depth -= 1
            if order_thread and (here, code.co_name) == ("serving/host/process.py", "place_order"):
                local.on, local.sent = False, True  # the order has left: what follows is the way back
            elif local.depth <= 0:
                local.on = False

    def __enter__(self):
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)


def listed(section: str) -> list[str]:
    """The backticked files of the document's block between <!-- section --> and <!-- /section -->."""
    text = DOC.read_text()
    block = re.search(rf"<!-- {section} -->(.*?)<!-- /{section} -->", text, re.S)
    assert block, f"docs/architecture.md has no <!-- {section} --> block"
    return re.findall(r"`((?:engine|serving|lab|kitchen_viz)/[\w/]+\.py)`", block.group(1))


def test_one_cook_runs_the_files_the_architecture_lists(tmp_path, monkeypatch):
    trace_file = tmp_path / "loop.json"
    monkeypatch.setenv(TRACE_ENV, str(trace_file))
    monkeypatch.setattr(mounted, "_SERVED", [])  # a kitchen of this test's own: its loop starts with the hook
    app_state._service.clear()  # and a kitchen client of its own (the page's are cached per process)
    at = open_kitchen(state={"tpk_model": "chef", "tpk_device": "cpu", "tpk_dtype": "float32"},
                      prompt="64", batch="4", new="8")  # fmt: skip
    host = mounted.served_here().host_for("chef", "cpu", "float32")
    sent_before = dict(host.process.sent)
    try:
        with Tracer() as tracer:
            next(b for b in at.button if "Cook" in b.label).click().run()
            job = at.session_state["tpk_job"]
            assert job.wait(120) and job.status == "done", job.error
        at.run()
        assert not at.exception, at.exception
        sent = {k: v - sent_before.get(k, 0) for k, v in host.process.sent.items() if v != sent_before.get(k, 0)}
        assert sent == {"Check": 1, "PlaceOrder": 1}  # one round trip, then the order
        child = json.loads(trace_file.read_text())
    finally:
        mounted.served_here().rooms.close()
        app_state._service.clear()
    path = tracer.path + [f for f in child["stack"] if f not in tracer.path]
    entered = tracer.entered + [f for f in child["entered"] if f not in tracer.entered]
    helpers = [f for f in entered if f not in path]
    print("path:", path, "\nhelpers:", helpers)  # the lists, for the document when they change
    assert len(path) <= MAX_PATH, path
    assert path == listed("cook-path")
    assert sorted(helpers) == sorted(listed("cook-helpers"))
