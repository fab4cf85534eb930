"""A failed CUDA-graph capture falls back to eager decoding, says so, and leaves nothing broken behind.

The capture itself needs a GPU, so these tests make `engine.cuda_graph.record` raise the error an
H200 really raised (`cudaErrorStreamCaptureInvalidated`, ../shared/notes/gpu-h200-first-run.md) and
check what the engine does with it on CPU: the same tokens as eager, one note in the trace, and the
next request unaffected.
"""

import functools

import pytest

import engine.cuda_graph as cuda_graph
import engine.torch_forward as forward_mod
from engine import Engine
from engine.cuda_graph import DecodeGraphs
from engine.events import Done
from engine.limits import RequestSettings

PROMPTS = [[11, 57, 3, 200, 42, 9, 101, 7], [5, 6]]
CAPTURE_ERROR = "CUDA error: operation failed due to a previous error during capture\nCUDA kernel errors..."


@pytest.fixture
def failing_capture(monkeypatch):
    calls = []

    def record(step, dev):
        calls.append(dev)
        step()  # the warm-up really runs before the capture fails, as on a GPU
        raise RuntimeError(CAPTURE_ERROR)

    monkeypatch.setattr(cuda_graph, "record", record)
    # an order's runner records its decode graphs as on a GPU (here the capture then fails)
    monkeypatch.setattr(forward_mod, "DecodeGraphs", functools.partial(DecodeGraphs, capture=True))
    return calls


def graphed_run(eng, prompts, n):
    """An order with cuda_graph=True (`generate` refuses it on a CPU before it runs)."""
    settings = RequestSettings(max_new_tokens=n, cuda_graph=True, stop_at_eos=False)
    return list(eng._serve_order(prompts, settings))[-1].result


def test_an_order_falls_back_to_eager_and_notes_it(tiny_llama, failing_capture):
    eng = Engine.load(str(tiny_llama.path))
    eager = eng.generate(PROMPTS, max_new_tokens=7, stop_at_eos=False)
    res = graphed_run(eng, PROMPTS, 7)
    assert failing_capture and res.tokens == eager.tokens
    (note,) = res.trace.notes
    assert note.startswith("CUDA graph capture failed, decoded eagerly: RuntimeError") and "\n" not in note
    assert eager.trace.notes == []


def test_a_failed_capture_does_not_poison_the_next_request(tiny_llama, failing_capture):
    eng = Engine.load(str(tiny_llama.path))
    first = graphed_run(eng, PROMPTS, 6)
    again = graphed_run(eng, PROMPTS, 6)  # records (and here fails) afresh: nothing cached from before
    assert len(failing_capture) == 2 and again.tokens == first.tokens and len(again.trace.notes) == 1
    after = eng.generate(PROMPTS[:1], max_new_tokens=6, stop_at_eos=False)
    assert after.tokens[0] == first.tokens[0] and after.trace.notes == []


def test_serving_bucket_whose_capture_failed_runs_eagerly(tiny_llama, failing_capture):
    eng = Engine.load(str(tiny_llama.path), policy="continuous", max_seqs=4, native=False)  # graphs: the torch forward's option
    srv = eng.serving
    srv.runner.forward.graphs = DecodeGraphs(eng.model, srv.pool, capture=True)
    ids = [eng.submit(p, max_new_tokens=6) for p in PROMPTS]
    done = {}
    while not eng.idle:
        done |= {ev.request_id: ev.result.tokens for ev in eng.step() if isinstance(ev, Done)}
    graphs = srv.runner.graphs
    assert 2 in graphs.failed and "capture" in graphs.failed[2] and 2 not in graphs.steps
    assert not graphs.fits(2)  # remembered: no second capture attempt, no broken graph replayed
    for rid, p in zip(ids, PROMPTS, strict=True):
        assert done[rid] == eng.generate([p], max_new_tokens=6).tokens[0]
