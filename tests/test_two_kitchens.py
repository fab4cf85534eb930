"""Two kitchens on this machine: prefill in one process, decode in another, gloo between them."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

from engine import Engine, EngineError
from serving.two_kitchens import PROBE_BYTES, fit_link, one_kitchen_stream, run_stream, run_two_kitchens


def test_two_kitchens_serve_what_one_kitchen_serves(tiny_llama):
    prompts = [[11, 57, 3, 200, 42, 9, 101, 7], list(range(40, 70))]
    runs, link = run_two_kitchens(str(tiny_llama.path), prompts, max_new_tokens=12, stop_at_eos=False)
    eng = Engine.load(str(tiny_llama.path))
    per_token = eng.cfg.kv_bytes_per_token(4)
    assert per_token == 2 * eng.cfg.n_layers * eng.cfg.n_kv_heads * eng.cfg.head_dim * 4
    for run, prompt in zip(runs, prompts, strict=True):
        assert run.tokens == eng.generate([prompt], max_new_tokens=12, stop_at_eos=False).tokens[0]
        assert run.round_trip_exact and run.prompt_tokens == len(prompt)
        assert run.kv_bytes == len(prompt) * per_token and run.kv_bytes_per_token == per_token
        assert run.ttft_s == pytest.approx(run.prefill_s + run.transfer_s + run.first_decode_s)
        assert min(run.prefill_s, run.transfer_s, run.first_decode_s) > 0
        assert run.predicted_transfer_s == pytest.approx(link.latency_s + run.kv_bytes / link.bytes_per_s)
    assert link.bytes_per_s > 0 and link.latency_s >= 0 and sorted(link.probes) == list(PROBE_BYTES)


def test_the_link_fit_recovers_latency_and_bandwidth():
    probes = {b: 50e-6 + b / 2e9 for b in PROBE_BYTES}  # a link of 50 us and 2 GB/s, exactly
    link = fit_link(probes)
    assert link.latency_s == pytest.approx(50e-6, rel=1e-6) and link.bytes_per_s == pytest.approx(2e9, rel=1e-6)
    assert link.predict(1 << 20) == pytest.approx(probes[1 << 20])


def test_a_stream_through_two_kitchens_serves_what_one_kitchen_serves(tiny_llama):
    orders = [([11, 57, 3, 200, 42, 9], 0.0), (list(range(40, 100)), 0.02), ([5, 6, 7], 0.04)]
    two = run_stream(str(tiny_llama.path), orders, max_new_tokens=10, stop_at_eos=False)
    eng = Engine.load(str(tiny_llama.path))
    one = one_kitchen_stream(eng, orders, max_new_tokens=10, stop_at_eos=False)
    for a, b, (prompt, arrival) in zip(one, two, orders, strict=True):
        assert a.tokens == b.tokens == eng.generate([prompt], max_new_tokens=10, stop_at_eos=False).tokens[0]
        assert a.prompt_tokens == b.prompt_tokens == len(prompt) and a.arrival_s == b.arrival_s == arrival
        assert len(a.itl_s) == len(b.itl_s) == 8  # gaps between the 9 decode tokens after the first
        assert min(b.prefill_s, b.handoff_s, b.first_decode_s) > 0 and b.queue_s >= 0
        assert b.ttft_s == pytest.approx(b.queue_s + b.prefill_s + b.handoff_s + b.first_decode_s)
        assert a.ttft_s == pytest.approx(a.queue_s + a.prefill_s) and a.handoff_s == 0


def test_adopting_a_prefilled_request_checks_what_it_is_given(tiny_llama):
    eng = Engine.load(str(tiny_llama.path))
    cfg = eng.cfg
    k = torch.zeros(cfg.n_layers, cfg.n_kv_heads, 3, cfg.head_dim)
    with pytest.raises(EngineError, match="adopted K/V must be"):
        eng.adopt([1, 2, 3, 4], 5, k, k, 8)
    with pytest.raises(EngineError, match="max_new_tokens >= 2"):
        eng.adopt([1, 2, 3], 5, k, k, 1)
    rid = eng.adopt([1, 2, 3], 5, k, k, 3)
    while not eng.idle:
        done = [e for e in eng.step() if getattr(e, "request_id", None) == rid and type(e).__name__ == "Done"]
    assert done[0].result.tokens[0] == 5 and len(done[0].result.tokens) == 3


def test_a_kitchen_process_that_dies_is_told_in_one_line_at_once(tiny_llama):
    """A kitchen killed mid-run says nothing on the queue: the parent notices its exit within seconds
    instead of waiting out the run's deadline."""
    result = {}

    def run():
        try:
            run_two_kitchens(str(tiny_llama.path), [[11, 57, 3]] * 60, max_new_tokens=120, timeout_s=600)
        except EngineError as err:
            result["error"], result["at"] = str(err), time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while len(multiprocessing.active_children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2)  # loading
    kitchens = [p for p in multiprocessing.active_children() if p.name.startswith(("Process", "SpawnProcess"))]
    assert len(kitchens) >= 2, multiprocessing.active_children()
    killed_at = time.monotonic()
    os.kill(kitchens[-1].pid, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive(), "the parent still waits for a dead kitchen"
    # told by the parent (the dead one's exit code) or by the survivor (its link to the dead one broke)
    said = result["error"]
    assert "\n" not in said and ("kitchen's process ended (exit code -9) before it finished" in said
                                  or said.startswith("a kitchen failed: ")), said  # fmt: skip
    assert result["at"] - killed_at < 30
