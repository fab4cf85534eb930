"""The engine in a child process: same answers as in-process, events in order, errors as one line.

Everything here runs the real engine (the embedded chef) in a real spawned child process.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from engine import Engine
from engine.errors import EngineError
from engine.events import Done, PrefillEnd, PrefillStart, StepEnd, Token
from kitchen_viz.orders import Order, cook
from serving import cores
from serving.cores import CoreSplit, split_cores
from serving.engine_process import EngineProcess
from serving.service import KitchenService

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
WAIT_S = 120


@pytest.fixture(scope="module")
def proc():
    p = EngineProcess("chef", "cpu", "float32", threads=1)
    yield p
    p.close()


def pid_and_progress(engine, steps: int, *, emit):
    """Runs in the child: says where it runs, emits progress, returns a fact about the real engine."""
    for i in range(steps):
        emit(("step", i))
    return os.getpid(), type(engine).__name__, engine.model.__class__.__name__


def cores_of_child(engine, *, emit):
    return sorted(os.sched_getaffinity(0))


def sleep_in_child(engine, seconds: float, *, emit):
    emit("sleeping")
    time.sleep(seconds)
    return "woke"


def test_the_engine_runs_in_another_process(proc):
    seen = []
    pid, kind, model = proc.proxy.run(pid_and_progress, 3, emit=seen.append)
    assert pid == proc.pid and pid != os.getpid()
    assert kind == "Engine" and model == "Transformer"
    assert seen == [("step", 0), ("step", 1), ("step", 2)]


def test_generate_equals_an_in_process_engine(proc):
    prompts = ["ROMEO:", "JULIET:\nO"]
    here = Engine.load("chef", device="cpu", dtype="float32").generate(prompts, max_new_tokens=12)
    there = proc.proxy.generate(prompts, max_new_tokens=12)
    assert there.tokens == here.tokens and there.texts == here.texts
    assert there.metrics.tpot_s > 0 and len(there.trace.decode_steps) == 11


def test_info_cfg_and_quick_questions_match_the_engine(proc):
    eng = proc.proxy
    assert eng.info.name == "chef" and eng.cfg.n_layers == eng.info.n_layers
    ids = eng.encode("ROMEO:")
    assert eng.decode(ids) == "ROMEO:" and eng.check(["ROMEO:"], 4)[0] == ids
    assert eng.limits(10, 20).max_context == eng.info.max_context


def test_stream_yields_the_engines_events_in_order(proc):
    events = list(proc.proxy.stream(["ROMEO:"], max_new_tokens=5, temperature=0.0))
    kinds = [type(e) for e in events]
    assert kinds[:2] == [PrefillStart, PrefillEnd] and kinds[-1] is Done
    assert kinds.count(Token) == 5 and kinds.count(StepEnd) == 5
    assert [e.step for e in events if isinstance(e, Token)] == [0, 1, 2, 3, 4]
    times = [e.t for e in events]
    assert times == sorted(times)
    assert events[-1].result.tokens[0] == [e.token_id for e in events if isinstance(e, Token)]


def test_closing_a_stream_early_stops_it_and_the_engine_stays_usable(proc):
    stream = proc.proxy.stream(["ROMEO:"], max_new_tokens=200, temperature=0.0, stop_at_eos=False)
    first = [next(stream) for _ in range(4)]
    stream.close()
    assert isinstance(first[0], PrefillStart)
    res = proc.proxy.generate(["ROMEO:"], max_new_tokens=3)
    assert len(res.tokens[0]) == 3


def test_a_refusal_crosses_as_one_engine_error_line(proc):
    with pytest.raises(EngineError, match="context") as err:
        proc.proxy.generate(["ROMEO:"], max_new_tokens=100_000)
    assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match="empty"):
        proc.proxy.stream([""], max_new_tokens=4)  # refused at the call, before any event
    with pytest.raises(EngineError, match="empty"):
        proc.proxy.check([""], 4)
    assert proc.proxy.generate(["A"], max_new_tokens=2).tokens  # still serving


def test_quick_questions_are_answered_while_a_job_runs(proc):
    result = {}
    job = threading.Thread(target=lambda: result.update(r=proc.proxy.run(sleep_in_child, 1.5)))
    job.start()
    time.sleep(0.3)
    t0 = time.perf_counter()
    assert proc.proxy.encode("ROMEO:")
    assert time.perf_counter() - t0 < 1.0  # did not wait for the sleeping job
    job.join(WAIT_S)
    assert result["r"] == "woke"


def test_an_unknown_model_is_one_line():
    with pytest.raises(EngineError, match="no-such-model") as err:
        EngineProcess("no-such-model", "cpu", "float32")
    assert "\n" not in str(err.value)


def test_a_killed_child_is_one_line_and_restart_brings_it_back():
    p = EngineProcess("chef", "cpu", "float32", threads=1)
    try:
        os.kill(p.pid, signal.SIGKILL)
        with pytest.raises(EngineError, match="stopped|not running") as err:
            p.proxy.generate(["ROMEO:"], max_new_tokens=2)
        assert "\n" not in str(err.value) and not p.alive
        p.restart()
        assert p.alive and p.proxy.generate(["ROMEO:"], max_new_tokens=2).tokens
    finally:
        p.close()


def test_the_kitchen_restarts_an_engine_that_died_mid_order():
    svc = KitchenService("chef", "cpu", "float32", threads=1)
    try:
        assert svc.wait_ready(WAIT_S) and svc.state == "ready"
        first_pid = svc.engine_pid
        job = svc.submit(lambda eng, emit: eng.run(sleep_in_child, 30, emit=emit), "sleeps")
        for _ in range(200):
            if job.events == ["sleeping"]:
                break
            time.sleep(0.05)
        os.kill(first_pid, signal.SIGKILL)
        assert job.wait(WAIT_S) and job.status == "error"
        assert "engine process" in job.error and "\n" not in job.error
        order = Order(batch=1, max_new_tokens=3, temperature=0.0, seed=0, text="ROMEO:")
        after = svc.submit(cook(order), "after the crash")
        assert after.wait(WAIT_S) and after.status == "done", after.error
        assert svc.engine_pid != first_pid and len(after.result.tokens[0]) == 3
    finally:
        svc.close()


def test_the_engine_keeps_its_own_cores_when_there_are_cores_to_spare(proc):
    split = split_cores(1)
    if split is None:
        pytest.skip("a single core: nothing to split")
    assert proc.proxy.run(cores_of_child) == sorted(split.engine)
    assert os.sched_getaffinity(0) != split.engine  # the test process itself was not pinned


def test_core_split_examples(monkeypatch):
    monkeypatch.setattr(cores, "ALL_CORES", frozenset({0, 1, 2, 3}))
    monkeypatch.delenv("TWO_POT_PIN", raising=False)
    assert split_cores(1) == CoreSplit(engine=frozenset({3}), server=frozenset({0, 1, 2}))
    assert split_cores(2) == CoreSplit(engine=frozenset({2, 3}), server=frozenset({0, 1}))
    assert split_cores(4) is None and split_cores(None) is None  # no core left for the server
    monkeypatch.setenv("TWO_POT_PIN", "0")
    assert split_cores(1) is None
