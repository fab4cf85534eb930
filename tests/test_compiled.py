"""`compile=True` (engine/compiled.py): the compiled decode step serves the eager step's tokens.

Every family's shape (Llama with GQA, Qwen2 with q/k/v bias and tied head, GPT-2 with LayerNorm,
learned positions and GELU) serves a busy kitchen -- prompts of different lengths decoding
together, one joining mid-way, batches shrinking as requests finish -- with the same greedy tokens
as eager and logits within 1e-4 of eager's at every step. A compile that cannot happen (no C++
compiler) or fails at the first step leaves the engine decoding eagerly, says so once, and loses
no request. A 40-step generation compiles a bounded number of graphs (batch 1 and batch > 1), also
when its batch crosses compile_max_batch (the steps above it run eagerly, same tokens). int8
weights decode compiled too (their product is one opaque op, engine/int8_op.py): the same two
graphs, no graph break, int8 eager's tokens.

Compiling is slow on two cores, so each family's compiled engine is built once for the module.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from conftest import make_tiny_model
from proc_kit import run
from torch._dynamo.utils import counters

from engine import Engine, EngineError
from engine.compiled import COMPILE_MAX_BATCH, compiler_problem
from engine.events import Done

FAMILIES = ["tiny_llama", "tiny_qwen2", "tiny_gpt2"]
PROMPTS = [[11, 57, 3, 200, 42, 9, 101, 7], [5, 6], list(range(30, 47))]
# step -> (prompt, max_new_tokens): two start together, the third joins while they decode
ARRIVALS = {0: [(PROMPTS[0], 12), (PROMPTS[1], 18)], 4: [(PROMPTS[2], 9)]}
LOGITS_ATOL = 1e-4  # float32; the compiled kernels sum in other orders than eager's
# int8: products round each 32-wide block of their inputs to 8 bits (engine/int8_op.py), so a sum-order
# difference in a fused norm can move one activation across a rounding boundary, and a logit by about
# one 8-bit step of its input times a weight. Stated bound: rtol 2^-7 (+ atol 1e-3 near 0). Measured
# 2026-12-01 (then one range per input row): at most 2.4e-7 on these models, same tokens.
INT8_LOGITS_RTOL, INT8_LOGITS_ATOL = 2**-7, 1e-3
INT8_ARRIVALS = {0: [(PROMPTS[0], 40), (PROMPTS[1], 25)], 4: [(PROMPTS[2], 9)]}  # 40 steps, batch 3 -> 2 -> 1


def serve(eng: Engine, arrivals=ARRIVALS) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Submit on schedule, step until idle: (tokens per request in submit order, logits of each step)."""
    runner = eng.serving.runner
    seen: list[torch.Tensor] = []
    run = runner.run

    def recording(plan):
        out = run(plan)
        seen.append(out.logits.clone())
        return out

    runner.run = recording
    ids, done, step = [], {}, 0
    while step <= max(arrivals) or not eng.idle:
        ids += [eng.submit(p, max_new_tokens=n, stop_at_eos=False) for p, n in arrivals.get(step, [])]
        done |= {ev.request_id: ev.result.tokens for ev in eng.step() if isinstance(ev, Done)}
        step += 1
    runner.run = run
    return [done[i] for i in ids], seen


@pytest.fixture(scope="module")
def engines(request) -> dict[str, tuple[Engine, Engine]]:
    """family -> (compiled engine, eager engine) over the same weights, compiled once for the module."""
    out = {}
    for name in FAMILIES:
        path = str(request.getfixturevalue(name).path)
        out[name] = Engine.load(path, compile=True, max_seqs=4), Engine.load(path, max_seqs=4)
    return out


@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
@pytest.mark.parametrize("family", FAMILIES)
def test_serving_with_compile_gives_eager_tokens_and_logits(engines, family):
    compiled, eager = engines[family]
    tokens, logits = serve(compiled)
    want, want_logits = serve(eager)
    assert tokens == want
    assert compiled.compiled.failure is None and compiled.compiled.steps >= 10  # really ran compiled
    assert len(logits) == len(want_logits)
    for got, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, ref, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_an_order_on_seats_decodes_compiled(engines):
    """generate() cooks a packed order of mixed lengths on seats: compiled steps, eager's tokens, no note."""
    compiled, eager = engines["tiny_llama"]
    before = compiled.compiled.steps
    res = compiled.generate(PROMPTS, max_new_tokens=10, stop_at_eos=False)
    ref = eager.generate(PROMPTS, max_new_tokens=10, stop_at_eos=False)
    assert res.path == "seats" and res.tokens == ref.tokens and res.trace.notes == []
    assert compiled.compiled.steps - before == 8  # 9 decode steps; the last reads a full seat: eager


@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_a_40_step_generation_crossing_compile_max_batch_compiles_a_bounded_number_of_graphs(tmp_path):
    """A shape no other test compiles, compile_max_batch=2: batch 3 (eager) -> 2 -> 1 (compiled) while
    the read width grows every step compiles two graphs (batch 1 and batch > 1), gives eager's tokens,
    and a second run on other seats compiles none."""
    tiny = make_tiny_model(tmp_path / "mha", "llama", seed=5, num_key_value_heads=4)
    eng = Engine.load(str(tiny.path), compile=True, max_seqs=4, compile_max_batch=2)
    graphs = counters["stats"]["unique_graphs"]
    arrivals = {0: [(PROMPTS[0], 40), (PROMPTS[1], 25), (PROMPTS[2], 10)]}
    tokens, _ = serve(eng, arrivals)
    assert [len(t) for t in tokens] == [40, 25, 10]
    assert tokens == serve(Engine.load(str(tiny.path), max_seqs=4), arrivals)[0]
    assert (eng.compiled.steps, eng.compiled.eager_steps) == (30, 9)  # 9 steps at batch 3, 15 at 2, 15 at 1
    assert counters["stats"]["unique_graphs"] - graphs == 2
    eng.generate(PROMPTS, max_new_tokens=12, stop_at_eos=False)  # a smaller pool
    assert counters["stats"]["unique_graphs"] - graphs == 2


def test_compile_max_batch_has_a_measured_default_and_refuses_nonsense(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), compile=True)
    assert eng.settings.compile_max_batch == eng.compiled.max_batch == COMPILE_MAX_BATCH >= 1
    for bad in (0, -1, 2.5, True):
        with pytest.raises(EngineError, match="compile_max_batch must be an int of at least 1"):
            Engine.load(str(tiny_llama.path), compile=True, compile_max_batch=bad)


def test_the_openmp_wait_policy_in_effect_says_when_torch_came_first():
    """libgomp reads OMP_WAIT_POLICY when torch loads it: engine's PASSIVE is too late after torch."""
    def policy(code: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        return run([sys.executable, "-c", f"{code}; print(engine.OMP_WAIT_POLICY_IN_EFFECT)"], env=env,
                   timeout=120).stdout.strip()

    assert policy("import engine") == "PASSIVE"
    assert policy("import torch, engine") == "default (torch imported before engine)"


def test_no_compiler_is_said_up_front_and_decodes_eagerly(tiny_llama, monkeypatch):
    from torch._inductor import config

    monkeypatch.delenv("CXX", raising=False)
    with (
        config.patch({"cpp.cxx": ("no-such-c++",)}),
        pytest.warns(
            RuntimeWarning, match=r"compile=True, decoding eagerly: .*needs a C\+\+ compiler.*no-such-c\+\+"
        ),
    ):
        eng = Engine.load(str(tiny_llama.path), compile=True)
    res = eng.generate(PROMPTS[:2], max_new_tokens=6)
    ref = Engine.load(str(tiny_llama.path)).generate(PROMPTS[:2], max_new_tokens=6)
    assert res.tokens == ref.tokens and eng.compiled.steps == 0
    (note,) = res.trace.notes
    assert note.startswith("compile=True, decoded eagerly: torch.compile on CPU needs a C++ compiler")


def test_a_compile_that_fails_at_the_first_step_falls_back_for_good(tiny_qwen2, monkeypatch):
    """Inductor raising when it builds (BackendCompilerFailed, CppCompileError, ...): that step and
    every later one decode eagerly, one warning, one note, every request served."""
    monkeypatch.setattr("engine.compiled.compiler_problem", lambda device: None)  # even without g++
    eng = Engine.load(str(tiny_qwen2.path), compile=True, max_seqs=4)
    calls = []

    def failing(*args):
        calls.append(1)
        raise RuntimeError("CppCompileError: C++ compile error\n g++: not found")

    eng.compiled.step_fn = failing
    with pytest.warns(
        RuntimeWarning, match="decoding eagerly from now on: compile failed: RuntimeError"
    ) as caught:
        tokens, _ = serve(eng)
    assert (
        len([w for w in caught if "compile=True" in str(w.message)]) == 1
        and len(calls) == 1
        and eng.compiled.steps == 0
    )
    assert tokens == serve(Engine.load(str(tiny_qwen2.path), max_seqs=4))[0]
    res = eng.generate(PROMPTS[:2], max_new_tokens=5)
    assert res.trace.notes == ["compile=True, decoded eagerly: compile failed: RuntimeError: CppCompileError: "
                               "C++ compile error g++: not found"]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_compiled_graph_buckets_give_the_cpu_tokens(tiny_llama):
    """On CUDA the compiled step is what each batch bucket's graph records: the CPU's eager tokens."""
    want, _ = serve(Engine.load(str(tiny_llama.path), max_seqs=4))
    eng = Engine.load(str(tiny_llama.path), device="cuda", compile=True, max_seqs=4)
    got, _ = serve(eng)
    graphs = eng.serving.runner.graphs
    assert got == want and eng.compiled.failure is None and eng.compiled.steps > 0
    assert graphs is not None and {1, 2} <= set(graphs.steps) and not graphs.failed


@pytest.fixture(scope="module")
def int8_engines(request) -> dict[str, tuple[Engine, Engine]]:
    """family -> (compiled, eager) int8 engines over the same weights, built once for the module."""
    out = {}
    for name in FAMILIES:
        path = str(request.getfixturevalue(name).path)
        out[name] = (Engine.load(path, compile=True, quant="int8", max_seqs=4),
                     Engine.load(path, quant="int8", max_seqs=4))  # fmt: skip
    return out


@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
@pytest.mark.parametrize("family", FAMILIES)
def test_int8_weights_decode_compiled_with_eager_tokens_in_two_graphs_without_breaks(int8_engines, family):
    """The int8 product is one opaque op (twopot::int8_matmul): a 40-step busy kitchen compiles the
    same 2 graphs as float32 (batch 1, batch > 1), breaks none, and serves int8 eager's tokens."""
    compiled, eager = int8_engines[family]
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    tokens, logits = serve(compiled, INT8_ARRIVALS)
    assert counters["stats"]["unique_graphs"] - graphs == 2
    assert sum(counters["graph_break"].values()) == breaks
    want, want_logits = serve(eager, INT8_ARRIVALS)
    assert tokens == want and [len(t) for t in tokens] == [40, 25, 9]
    assert compiled.compiled.failure is None and compiled.compiled.steps >= 35  # really ran compiled
    for got, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, ref, atol=INT8_LOGITS_ATOL, rtol=INT8_LOGITS_RTOL)


@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_cli_generate_and_bench_take_compile(tiny_llama, tmp_path, capsys):
    """`python -m engine generate --compile` decodes compiled; `bench --compile` reports both ways."""
    import json

    from engine.cli import main as cli_main

    args = ["generate", "--model", str(tiny_llama.path), "--prompt-ids", "5,6,7", "--batch", "2", "--json"]
    assert cli_main([*args, "--max-new-tokens", "6", "--compile"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert cli_main([*args, "--max-new-tokens", "6"]) == 0
    assert compiled["tokens"] == json.loads(capsys.readouterr().out)["tokens"]
    out = tmp_path / "compiled.json"
    from engine.bench.cli import main as bench_main

    code = bench_main(["--compile", "--model", str(tiny_llama.path), "--repeats", "1", "--decode-tokens", "4",
                     "--batch", "3", "--out", str(out), "--quiet"])  # fmt: skip
    (m,) = json.loads(out.read_text())["models"]
    assert code == 0 and set(m["tpot_s"]) == {"b1", "b3"} and m["same_tokens"] and m["failure"] is None
    assert m["compiled_steps"] > 0 and m["ratios"]["b1"] > 0
