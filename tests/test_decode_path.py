"""The pure-decode step's path: the runner's reused input buffers, the per-layer KV seats, the
compiled step being the model's own pass, and the step profile (engine/bench/step_profile.py).

Tokens equal to the general path's are the parity tests' job (test_engine_serving.py and the
others run every decode step through this path); these check the mechanics underneath.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine
from engine.bench.step_profile import PARTS, profile
from engine.compiled import compiler_problem
from engine.kv_pool import SeatPool


def test_decode_steps_refill_the_same_input_buffers(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), native=False)  # the model's forward sees the buffers
    eng.submit([3, 1, 4, 1, 5], 6, stop_at_eos=False)
    eng.submit([9, 2, 6], 6, stop_at_eos=False)
    runner, seen = eng.serving.runner, []
    forward = runner.model.forward

    def spy(tokens, positions, kv, logits_rows=None):
        seen.append((tokens.data_ptr(), positions.data_ptr(), kv.sb.decode_index.data_ptr(), tokens[:, 0].tolist(),
                     positions[:, 0].tolist()))  # fmt: skip
        return forward(tokens, positions, kv, logits_rows)

    runner.model.forward = spy
    try:
        while not eng.idle:
            eng.step()
    finally:
        del runner.model.forward
    decodes = [s for s in seen if len(s[3]) == 2]
    assert len(decodes) >= 4
    assert len({s[:3] for s in decodes}) == 1  # one set of buffers for batch 2, step after step
    assert [s[4] for s in decodes[:2]] == [[5, 3], [6, 4]]  # each row's own position, refilled in place


def test_each_layers_seats_are_their_own_memory_and_index_like_one_tensor(tiny_llama):
    eng = Engine.load(str(tiny_llama.path))
    pool = SeatPool(eng.cfg, 3, 8, torch.float32, "cpu")
    ptrs = {t.untyped_storage().data_ptr() for t in (*pool.k_layer, *pool.v_layer)}
    assert len(ptrs) == 2 * eng.cfg.n_layers  # no two layers share a storage: the compiled step writes them in place
    L, hkv, D = eng.cfg.n_layers, eng.cfg.n_kv_heads, eng.cfg.head_dim
    stacked = torch.arange(L * hkv * 4 * D, dtype=torch.float32).view(L, hkv, 4, D)  # (L, Hkv, 4, D)
    pool.k[:, 1, :, :4] = stacked  # layer i gets row i
    pool.k[:, 2, :, :4] = 7.0  # a scalar goes to every layer
    assert torch.equal(pool.k[:, 1, :, :4], stacked) and torch.equal(pool.k_layer[L - 1][1, :, :4], stacked[L - 1])
    assert (pool.k[:, 2, :, :4] == 7.0).all()
    with pytest.raises(IndexError, match="every layer"):
        pool.k[0]


@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_the_compiled_step_is_the_models_own_forward(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), compile=True)
    assert eng.compiled.step_fn._torchdynamo_orig_callable == eng.compiled._decode_pass
    calls = []
    forward = eng.model.forward
    eng.model.forward = lambda *a: calls.append(a) or forward(*a)  # the pass the eager path runs too
    try:
        eng.compiled._decode_pass(*_decode_inputs(eng))
    finally:
        del eng.model.forward
    assert len(calls) == 1 and type(calls[0][2]).__name__ == "SeatKV"


@pytest.mark.parametrize("native", [False, True])
def test_the_step_profile_splits_a_real_step_into_its_parts(tiny_llama, native):
    report = profile(str(tiny_llama.path), steps=4, threads=torch.get_num_threads(), compile_=False, rounds=1,
                     prompt_len=16, native=native)  # fmt: skip
    us, fast = report["us_median_of_rounds"], report["fastest_step_us"]
    assert set(us) == set(fast) == {*PARTS, "step"} and report["native"] is native
    assert all(us[p] > 0 for p in PARTS) and all(fast[p] > 0 for p in PARTS)  # no wrapper counted twice
    assert fast["step"] <= us["step"] and sum(fast[p] for p in PARTS) == pytest.approx(fast["step"])
    if not native:  # op by op, the model is the largest part; in one call it can be smaller than the events
        assert fast["model"] == max(fast[p] for p in PARTS)
    assert report["ops_per_step"] is None  # asked for no operator profile


def test_the_step_profile_names_the_operators_of_a_step(tiny_llama):
    report = profile(str(tiny_llama.path), steps=4, threads=1, compile_=False, rounds=1, prompt_len=16, ops=30,
                     native=False)  # fmt: skip
    ops = report["ops_per_step"]
    top = ops["top"]
    assert len(top) == 30
    assert [r["self_us"] for r in top] == sorted((r["self_us"] for r in top), reverse=True)
    by_name = {r["op"]: r for r in top}
    # tiny_llama: 2 layers of 4 weight products each (qkv, out, gate_up, down), and the LM head
    assert by_name["aten::mm"]["calls"] == 2 * 4 + 1
    assert sum(r["self_us"] for r in top) < ops["step_us_under_profiler"]


def test_the_step_profile_sees_the_native_step_as_one_call_a_step(tiny_llama):
    from engine.native import NATIVE_LABEL

    report = profile(str(tiny_llama.path), steps=4, threads=1, compile_=False, rounds=1, prompt_len=16, ops=30)
    by_name = {r["op"]: r for r in report["ops_per_step"]["top"]}
    if not report["native"]:
        pytest.skip("the native step could not be built here")
    assert by_name[NATIVE_LABEL]["calls"] == 1 and "aten::mm" not in by_name  # no weight product op by op


def _decode_inputs(eng):
    """One pure-decode step's inputs for seat 0, as the runner builds them."""
    from engine.kv_pool import SeatBatch

    pool = SeatPool(eng.cfg, 1, 8, torch.float32, "cpu")
    index = torch.tensor(pool.row_index_list([2]))
    bias = torch.zeros(1, 1, 1, 3)  # (1, 1, 1, W)
    return torch.tensor([[5]]), torch.tensor([[2]]), SeatBatch(index, 0, 3, bias, [], 1), pool
