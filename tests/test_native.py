"""The native step (engine/native.py, engine/native_step.c) against the model's own forward.

Every family's shape (Llama with GQA, a tied Llama, Qwen2 with q/k/v bias, StarCoder2 and OLMo with
LayerNorms and an ungated GELU MLP, GPT-2 with learned positions) serves a busy kitchen -- prompts of
different lengths decoding together, one joining mid-way, batches shrinking as requests finish --
with the model forward's greedy tokens and logits within 1e-4 at every step, in float32 and int8.
A request's decode logits are the same bits alone or inside a batch. Prefill then N native steps
give one full forward's logits, and generate() gives transformers' greedy tokens. Without a
compiler, or where the build fails, the engine says why in one line and decodes through the model.
"""

from __future__ import annotations

import os
import platform
import sys

import pytest
import torch
from proc_kit import run
from test_compiled import (
    INT8_ARRIVALS,
    INT8_LOGITS_ATOL,
    INT8_LOGITS_RTOL,
    LOGITS_ATOL,
    PROMPTS,
    serve,
)

from engine import Engine, EngineError
from engine.native import NATIVE_GROUP
from engine.native_build import Build, library
from engine.native_ops import product as native_product

FAMILIES = ["tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_starcoder2", "tiny_olmo", "tiny_gpt2"]
pytestmark = pytest.mark.skipif(isinstance(library(), str), reason="the native step could not be built here")


def pair(path, **kw) -> tuple[Engine, Engine]:
    return Engine.load(str(path), max_seqs=4, **kw), Engine.load(str(path), max_seqs=4, native=False, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_serving_natively_gives_the_forwards_tokens_and_logits(request, family):
    native, forward = pair(request.getfixturevalue(family).path)
    tokens, logits = serve(native)
    want, want_logits = serve(forward)
    assert tokens == want
    assert native.native.problem is None and native.native.steps >= 10 and native.native.eager_steps == 0
    assert native.native.passes >= 2  # the two first prompts, then the third beside their decode rows
    assert forward.native is None and forward.decode_step is None
    assert len(logits) == len(want_logits)
    for got, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, ref, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen2", "tiny_gpt2"])
def test_int8_serving_natively_gives_the_forwards_tokens(request, family):
    """The model's int8 products op by op run the same kernel (engine/int8_op.py): same tokens."""
    native, forward = pair(request.getfixturevalue(family).path, quant="int8")
    assert native.model.lm_head_t.native  # the engine's own int8 product serves
    tokens, logits = serve(native, INT8_ARRIVALS)
    want, want_logits = serve(forward, INT8_ARRIVALS)
    assert tokens == want and native.native.steps >= 30
    for got, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, ref, atol=INT8_LOGITS_ATOL, rtol=INT8_LOGITS_RTOL)


def test_an_order_decodes_natively_with_transformers_greedy_tokens(tiny_llama):
    eng = Engine.load(str(tiny_llama.path))
    prompt = PROMPTS[0]
    res = eng.generate([prompt], max_new_tokens=16, stop_at_eos=False)
    with torch.inference_mode():
        ref = tiny_llama.hf().generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
    assert res.tokens[0] == ref[0, len(prompt) :].tolist()
    assert eng.native.steps == 15 and res.trace.notes == []


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_gpt2"])
def test_prefill_then_native_steps_equal_one_full_forward(request, family):
    """A native prompt pass, then N native decode steps: each pass's logits == the full forward's at that position."""
    eng = Engine.load(str(request.getfixturevalue(family).path), max_seqs=4)
    prompt = PROMPTS[2]
    tokens, logits = serve(eng, {0: [(prompt, 9)]})
    seq = prompt + tokens[0]
    with torch.inference_mode():
        full = eng.model(torch.tensor([seq[:-1]]), torch.arange(len(seq) - 1)[None])[0]  # (T, V)
    steps = torch.cat(logits)  # (9, V): the prefill's last row, then 8 decode steps
    torch.testing.assert_close(steps, full[len(prompt) - 1 :], atol=LOGITS_ATOL, rtol=0)
    assert eng.native.passes == 1 and eng.native.steps == 8


@pytest.mark.parametrize("quant", [None, "int8"])
def test_a_rows_logits_are_the_same_bits_alone_or_in_a_batch(tiny_llama, quant):
    """Every output element sums its products in one order whatever the batch (native_step.c)."""
    from engine.attention import BatchKV

    eng = Engine.load(str(tiny_llama.path), max_seqs=4, quant=quant)
    pool = eng.serving.pool
    with torch.inference_mode():  # seats 0..2 hold a prompt's K/V (one fixed-batch pass), then decode slot 17
        eng.model(torch.tensor([PROMPTS[2]] * 3), torch.arange(17).expand(3, 17), BatchKV(pool, torch.arange(17)))
        alone = eng.native(torch.tensor([[7]]), torch.tensor([[17]]), None, pool)  # (1, V)
        batch = eng.native(torch.tensor([[7], [9], [7]]), torch.tensor([[17], [17], [17]]), None, pool)  # (3, V)
    assert torch.equal(batch[0], alone[0]) and not torch.equal(batch[1], alone[0])


def test_passes_longer_than_a_group_run_a_group_at_a_time(tiny_llama):
    """Groups of 2 rows: a 17-token prompt is 9 groups, a batch of 3 is 2 groups; the forward's tokens."""
    native, forward = pair(tiny_llama.path)
    native.native.group = 2
    arrivals = {0: [(PROMPTS[0], 20), (PROMPTS[1], 12), (PROMPTS[2], 6)]}
    tokens, logits = serve(native, arrivals)
    want, want_logits = serve(forward, arrivals)
    assert tokens == want and native.native.eager_steps == 0
    for got, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, ref, atol=LOGITS_ATOL, rtol=0)
    assert NATIVE_GROUP >= 32


def test_chunked_prompts_beside_decode_rows_give_the_forwards_tokens(tiny_llama):
    """A token budget of 6: long prompts are cut into chunks that share passes with decode rows."""
    kw = dict(max_seqs=4, policy="chunked", token_budget=6)
    native = Engine.load(str(tiny_llama.path), **kw)
    forward = Engine.load(str(tiny_llama.path), native=False, **kw)
    arrivals = {0: [(PROMPTS[0], 10)], 2: [(PROMPTS[2], 8)], 3: [(list(range(60, 80)), 5)]}
    tokens, logits = serve(native, arrivals)
    assert tokens == serve(forward, arrivals)[0]
    assert native.native.passes >= 5 and native.native.eager_steps == 0


def test_a_position_outside_the_seats_is_one_line(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), max_seqs=2)
    pool = eng.serving.pool
    with pytest.raises(EngineError, match=f"outside the pool \\(seat_len {pool.seat_len}, 2 seats\\)"):
        eng.native(torch.tensor([[1]]), torch.tensor([[pool.seat_len]]), None, pool)
    with pytest.raises(EngineError, match="outside the pool"):
        eng.native.run([1, 2], [0, 1], [0, 2], [1], pool)  # seat 2 of 2


def test_batch_invariant_mode_and_16_bit_models_take_the_forward(tiny_llama):
    assert Engine.load(str(tiny_llama.path), batch_invariant=True).decode_step is None
    bf16 = Engine.load(str(tiny_llama.path), dtype="bfloat16")
    assert "float32 activations" in bf16.native.problem
    res = bf16.generate([PROMPTS[0]], max_new_tokens=4)
    assert len(res.tokens[0]) == 4 and bf16.native.eager_steps == 3


def test_the_engine_says_which_step_cooks_and_for_which_instructions(tiny_llama):
    """ModelInfo.decode_step, for the Kitchen's main view: the instruction set the step was built for
    (torch's own CPU detection names the widest vectors this CPU has), or op by op and why."""
    build, machine = Build.from_env(), platform.machine().lower()
    if build.portable:
        want = "portable C"
    elif build.arch == "x86-64-v2":
        want = "SSE"
    elif machine in ("aarch64", "arm64"):
        want = "NEON"
    else:
        want = {"AVX512": "AVX-512", "AVX2": "AVX2"}.get(torch.backends.cpu.get_cpu_capability(), "SSE")
    eng = Engine.load(str(tiny_llama.path))
    assert eng.native.isa.startswith(want) and eng.info.decode_step == f"native ({eng.native.isa})"
    assert Engine.load(str(tiny_llama.path), native=False).info.decode_step == "op by op: the model's forward"
    bf16 = Engine.load(str(tiny_llama.path), dtype="bfloat16").info.decode_step
    assert bf16 == "op by op: the native step runs float32 activations (the model's are torch.bfloat16)"


def _in_child(code: str, env: dict[str, str]) -> str:
    return run([sys.executable, "-c", code], env=os.environ | env, timeout=300).stdout.strip()


CHILD = """
import engine
eng = engine.Engine.load({path!r})
res = eng.generate([[5, 6, 7]], max_new_tokens=6, stop_at_eos=False)
print(eng.native.problem)
print(res.tokens[0], eng.native.steps, eng.native.eager_steps)
"""


@pytest.mark.parametrize("cc, why", [("/nonexistent/cc", "needs a C compiler"), ("false", "building the native step failed")])
def test_without_a_working_compiler_the_engine_says_why_and_decodes_through_the_model(tiny_llama, tmp_path, cc, why):
    """An empty build cache and no usable compiler: one line in `problem`, the forward's tokens."""
    want = Engine.load(str(tiny_llama.path), native=False).generate([[5, 6, 7]], max_new_tokens=6, stop_at_eos=False)
    path = "/nonexistent" if cc.startswith("/") else os.environ["PATH"]
    out = _in_child(CHILD.format(path=str(tiny_llama.path)),
                    {"CC": cc, "PATH": path, "TWO_POT_NATIVE_CACHE": str(tmp_path)}).splitlines()  # fmt: skip
    assert why in out[0] and "\n" not in out[0]
    assert out[1] == f"{want.tokens[0]} 0 5"


def test_the_build_is_cached_per_machine(tiny_llama, tmp_path):
    """The first process builds the library into the cache; a later one loads it without a compiler."""
    out = _in_child(CHILD.format(path=str(tiny_llama.path)), {"TWO_POT_NATIVE_CACHE": str(tmp_path)})
    assert out.splitlines()[0] == "None" and len(list(tmp_path.glob("native_step-*.so"))) == 1
    again = _in_child(CHILD.format(path=str(tiny_llama.path)),
                      {"TWO_POT_NATIVE_CACHE": str(tmp_path), "CC": "/nonexistent/cc", "PATH": "/nonexistent"})  # fmt: skip
    assert again.splitlines() == out.splitlines()


def test_the_cache_key_follows_the_cpus_features(monkeypatch):
    """A step built for one CPU is never loaded on another: the probe's answer is in the file's name."""
    from engine import native_build

    features = native_build.cpu_features("cc")
    assert features.split()[0] == platform.machine() and len(features.split()) > 2  # the CPU's own words
    build = Build()
    here = native_build.cached_path(build, build.cflags(), "cc")
    monkeypatch.setattr(native_build, "cpu_features", lambda cc: features + " and one more")  # a CPU with more
    assert native_build.cached_path(build, build.cflags(), "cc") != here


def test_the_native_sweep_times_both_paths_on_a_real_engine(tiny_llama, capsys):
    from engine.bench.native_sweep import main, sweep

    report = sweep(str(tiny_llama.path), None, [1, 3], prompt=4, new=5, rounds=1)
    assert [r["batch"] for r in report["rows"]] == [1, 3]
    for r in report["rows"]:
        assert r["native_step_ms"] > 0 and r["op_by_op_step_ms"] > 0
        assert r["ratio"] == r["op_by_op_step_ms"] / r["native_step_ms"]
    capsys.readouterr()
    assert main(["--model", str(tiny_llama.path), "--batches", "0,2"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: batches, --prompt")


def test_the_kernel_ceilings_time_the_native_products_for_decode_and_prefill(tiny_llama):
    """engine/bench/ceilings.py: the native step's own products, decode rows and a prompt's rows (LM head one row)."""
    from engine.bench.ceilings import measure_ceilings

    eng = Engine.load(str(tiny_llama.path))
    c = measure_ceilings(eng.model, 24, (1, 4), repeats=2)
    assert set(c["native_decode_step_s"]) == {"b1", "b4"} and all(v > 0 for v in c["native_decode_step_s"].values())
    assert c["native_prefill_gemm_s"] > 0
    assert measure_ceilings(Engine.load(str(tiny_llama.path), quant="int8").model, 8, (1,), 1)["native_prefill_gemm_s"] is None


@pytest.mark.parametrize("quant", [None, "int8"])
def test_threads_share_the_products_with_the_same_bits(tiny_llama, monkeypatch, quant):
    """Two threads split each product's columns (int8: weight rows); every element is still summed by
    one thread in one order, so tokens and every pass's logits are the same bits as on one thread."""
    import engine.native as native_mod

    monkeypatch.setattr(native_mod, "THREADS_MIN_BYTES", 0)  # the tiny model's weights sit in cache
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            eng = Engine.load(str(tiny_llama.path), max_seqs=4, quant=quant)
            assert eng.native.threads() == threads
            runs.append(serve(eng))
    finally:
        torch.set_num_threads(before)
    (tokens1, logits1), (tokens2, logits2) = runs
    assert tokens1 == tokens2 and all(torch.equal(a, b) for a, b in zip(logits1, logits2, strict=True))


def test_a_small_model_shares_only_passes_of_a_whole_group(tiny_llama):
    """Weights in cache: decode steps on one thread, a prompt's group of 64 rows on all of them."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        native = Engine.load(str(tiny_llama.path)).native
        assert native.weight_bytes < 64 << 20
        assert native.threads(1) == native.threads(NATIVE_GROUP - 1) == 1 and native.threads(NATIVE_GROUP) == 2
    finally:
        torch.set_num_threads(before)


def test_a_forked_child_runs_threaded_passes_without_the_parents_threads(tiny_llama, monkeypatch):
    """The crew's threads do not survive fork(): the child must start its own, not wait on the parent's."""
    import multiprocessing

    import engine.native as native_mod

    monkeypatch.setattr(native_mod, "THREADS_MIN_BYTES", 0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        eng = Engine.load(str(tiny_llama.path), max_seqs=2)
        want = eng.generate([PROMPTS[0]], max_new_tokens=6, stop_at_eos=False).tokens[0]
        out = multiprocessing.get_context("fork").Queue()

        def child():
            out.put(eng.generate([PROMPTS[0]], max_new_tokens=6, stop_at_eos=False).tokens[0])

        proc = multiprocessing.get_context("fork").Process(target=child)
        proc.start()
        proc.join(timeout=120)
        assert proc.exitcode == 0, "the child hung or died"
        assert out.get(timeout=5) == want
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("n", [16400, 1000])  # k rows 64 KB apart (packed panel by panel, plus a tail), and not
def test_the_float32_product_gives_each_row_the_same_bits_at_every_row_count(n):
    """gemm_kmajor streams 1-4 rows, runs 6-row blocks above, and copies a panel of a weight whose
    rows lie far apart for the blocks after the first: every row's sums keep one order throughout."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(32, 64, generator=g), torch.randn(64, n, generator=g)  # (B, K), (K, N)

    def product(rows: torch.Tensor) -> torch.Tensor:
        return native_product(rows, w)

    alone = torch.cat([product(x[i : i + 1].contiguous()) for i in range(32)])  # (32, N), one row at a time
    for rows in (5, 7, 13, 32):
        assert torch.equal(product(x[:rows].contiguous()), alone[:rows])
    torch.testing.assert_close(alone, x @ w, rtol=1e-4, atol=1e-4)
