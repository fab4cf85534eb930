"""The serving core on the real engine: submit / step / cancel under every policy.

The reference for every request is the same request served alone: a busy kitchen must not change
what any table is served (greedy, or sampled with its own seed), whatever joins or leaves the
batch, whether its prompt is cut into chunks, and whether it is preempted and recomputed.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineError
from engine.cuda_graph import DecodeGraphs
from engine.events import Done, StepEnd, Token

FAMILIES = ["tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gpt2"]
POLICIES = ["static", "continuous", "chunked"]
PROMPTS = [
    [11, 57, 3, 200, 42, 9, 101, 7],
    [5, 6],
    list(range(30, 70)),  # 40 tokens: several chunks at a small budget
    [99, 98, 97, 96, 95],
]


@pytest.fixture(params=FAMILIES)
def tiny(request):
    return request.getfixturevalue(request.param)


def serve(eng: Engine, arrivals: dict[int, list[tuple[list[int], dict]]], max_steps: int = 2000):
    """Submit each request at its step number, step until idle. Returns (results by submit order,
    every StepEnd, the order in which requests first entered a step)."""
    ids, results, steps, first_seen = [], {}, [], []
    step = 0
    while step <= max(arrivals) or not eng.idle:
        for prompt, settings in arrivals.get(step, []):
            ids.append(eng.submit(prompt, **settings))
        for ev in eng.step():
            if isinstance(ev, Done):
                results[ev.request_id] = ev.result
            elif isinstance(ev, StepEnd):
                steps.append(ev)
                first_seen += [r for r in ev.request_ids if r not in first_seen]
        step += 1
        assert step < max_steps, "the engine did not finish"
    return [results[i] for i in ids], steps, [ids.index(r) for r in first_seen]


def alone(path, prompt, policy="continuous", **settings):
    eng = Engine.load(str(path), policy=policy)
    (res,), _, _ = serve(eng, {0: [(prompt, settings)]})
    return res.tokens


@pytest.mark.parametrize("policy", POLICIES)
def test_staggered_requests_get_the_tokens_they_get_alone(tiny, policy):
    eng = Engine.load(str(tiny.path), policy=policy, token_budget=16)
    arrivals = {0: [(PROMPTS[0], {"max_new_tokens": 12})], 2: [(PROMPTS[1], {"max_new_tokens": 20})],
                3: [(PROMPTS[2], {"max_new_tokens": 9}), (PROMPTS[3], {"max_new_tokens": 15})]}  # fmt: skip
    results, steps, _ = serve(eng, arrivals)
    settings = [s for step in sorted(arrivals) for _, s in arrivals[step]]
    prompts = [p for step in sorted(arrivals) for p, _ in arrivals[step]]
    for res, prompt, s in zip(results, prompts, settings, strict=True):
        assert res.finish_reason == "length" and len(res.tokens) == s["max_new_tokens"]
        assert res.tokens == eng.generate([prompt], **s).tokens[0]  # the fixed-batch path, alone
    assert max(len(s.request_ids) for s in steps) >= 2  # they really shared steps
    if policy == "chunked":
        assert all(s.prefill_tokens + s.decode_tokens <= 16 for s in steps)
        assert any(s.step.phase == "mixed" for s in steps)
    if policy == "continuous":
        assert all(s.prefill_tokens == 0 or s.decode_tokens == 0 for s in steps)


def test_sampled_tokens_with_a_seed_do_not_depend_on_the_batch(tiny_llama):
    settings = {"max_new_tokens": 16, "temperature": 0.9, "top_k": 50, "seed": 1234}
    solo = alone(tiny_llama.path, PROMPTS[0], "chunked", **settings)
    eng = Engine.load(str(tiny_llama.path), policy="chunked", token_budget=8)
    busy = {0: [(PROMPTS[2], {"max_new_tokens": 30, "temperature": 1.0, "seed": 1})],
            1: [(PROMPTS[0], settings), (PROMPTS[3], {"max_new_tokens": 5, "temperature": 0.5, "seed": 9})]}  # fmt: skip
    results, _, _ = serve(eng, busy)
    assert results[1].tokens == solo
    assert alone(tiny_llama.path, PROMPTS[0], "chunked", **(settings | {"seed": 4321})) != solo  # the seed matters


@pytest.mark.parametrize("k", [1, 2, 3, 5, 16])
def test_chunked_prefill_gives_the_logits_of_one_pass(tiny, k):
    eng = Engine.load(str(tiny.path), policy="chunked", token_budget=k)
    prompt = PROMPTS[2][:23]
    eng.submit(prompt, max_new_tokens=2)
    srv = eng.serving
    chunks = []
    with torch.inference_mode():
        while True:
            plan = srv.scheduler.schedule(0.0)
            chunks.append(plan.work[0].length)
            out = srv.runner.run(plan)
            if out.sampled:
                break
        full = eng.model(torch.tensor([prompt]), torch.arange(len(prompt))[None])[0, -1]
    assert sum(chunks) == len(prompt) and max(chunks) <= k
    torch.testing.assert_close(out.logits[0], full, atol=1e-4, rtol=0)


def test_cancel_frees_the_seat_at_the_next_step_and_ends_with_done(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), policy="continuous")
    keep = eng.submit(PROMPTS[0], max_new_tokens=10)
    drop = eng.submit(PROMPTS[2], max_new_tokens=50)
    for _ in range(3):
        eng.step()
    pool = eng.serving.pool
    assert pool.free_seats == pool.seats - 2 and pool.tokens_in_use > 40
    assert eng.cancel(drop) is True
    events = eng.step()
    done = [e for e in events if isinstance(e, Done)]
    assert [d.request_id for d in done] == [drop] and done[0].result.finish_reason == "cancelled"
    assert pool.free_seats == pool.seats - 1 and pool.tokens_in_use < 20
    assert not any(isinstance(e, Token) and e.request_id == drop for e in events)
    results = {}
    while not eng.idle:
        results |= {e.request_id: e.result for e in eng.step() if isinstance(e, Done)}
    assert results[keep].tokens == eng.generate([PROMPTS[0]], max_new_tokens=10).tokens[0]
    assert eng.cancel(keep) is False  # already finished: nothing to stop
    waiting = eng.submit(PROMPTS[1], max_new_tokens=5)
    assert eng.cancel(waiting) is True  # never ran: leaves the line
    (ev,) = eng.step()
    assert ev.result.finish_reason == "cancelled" and ev.result.metrics is None and eng.idle
    with pytest.raises(EngineError, match="no request 99"):
        eng.cancel(99)


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_preemption_recomputes_and_changes_no_token(tiny_llama, policy):
    """KV memory for 60 tokens, three requests that need 8+30, 2+30 and 5+30: someone must be evicted."""
    eng = Engine.load(str(tiny_llama.path), policy=policy, kv_tokens=60, token_budget=16)
    arrivals = {0: [(PROMPTS[0], {"max_new_tokens": 30}), (PROMPTS[1], {"max_new_tokens": 30})],
                1: [(PROMPTS[3], {"max_new_tokens": 30})]}  # fmt: skip
    results, steps, _ = serve(eng, arrivals)
    preempted = [r for s in steps for r in s.preempted]
    assert preempted, "nothing was preempted"
    assert all(s.step.kv_bytes <= 60 * eng.serving.pool.bytes_per_token for s in steps)
    assert sum(r.metrics.preemptions for r in results) == len(preempted)
    for res, (prompt, s) in zip(results, arrivals[0] + arrivals[1], strict=True):
        assert res.tokens == eng.generate([prompt], **s).tokens[0]


@pytest.mark.parametrize("policy", POLICIES)
def test_first_come_first_served_no_starvation(tiny_llama, policy):
    """A long order among a stream of short ones enters the kitchen in its turn and finishes."""
    eng = Engine.load(str(tiny_llama.path), policy=policy, max_seqs=3, token_budget=12)
    arrivals = {i: [([7 + i, 8, 9], {"max_new_tokens": 6})] for i in range(0, 30, 2)}
    arrivals[3] = [(PROMPTS[2], {"max_new_tokens": 8})]
    results, _, entered = serve(eng, arrivals)
    assert entered == sorted(entered)  # nobody overtook anybody
    assert all(r.finish_reason == "length" for r in results)


def test_static_admits_a_batch_and_makes_later_orders_wait(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), policy="static")
    arrivals = {0: [(PROMPTS[0], {"max_new_tokens": 10}), (PROMPTS[1], {"max_new_tokens": 4})],
                1: [(PROMPTS[3], {"max_new_tokens": 3})]}  # fmt: skip
    results, steps, _ = serve(eng, arrivals)
    late = [i for i, s in enumerate(steps) if len(s.request_ids) and 2 in s.request_ids]
    first_batch_end = max(i for i, s in enumerate(steps) if 0 in s.request_ids)
    assert min(late) > first_batch_end  # it waited for the whole first batch
    assert steps[0].prefill_tokens == len(PROMPTS[0]) + len(PROMPTS[1])  # one pass for the batch


def test_request_metrics_follow_vllms_definitions(tiny_llama):
    eng = Engine.load(str(tiny_llama.path))
    results, _, _ = serve(eng, {0: [(PROMPTS[0], {"max_new_tokens": 6}), (PROMPTS[1], {"max_new_tokens": 1})]})
    m = results[0].metrics
    assert 0 <= m.queue_s <= m.ttft_s <= m.e2e_s
    assert len(m.itl_s) == 5 and m.tpot_s == pytest.approx(sum(m.itl_s) / 5)
    assert m.e2e_s == pytest.approx(m.ttft_s + sum(m.itl_s))
    assert results[1].metrics.tpot_s is None and results[1].metrics.output_tokens == 1


def test_decode_graph_buckets_pad_and_give_the_same_tokens(tiny_llama):
    """The CUDA-graph bucket path with its static buffers, replayed eagerly (capture needs a GPU)."""
    eng = Engine.load(str(tiny_llama.path), policy="continuous", max_seqs=8, native=False)  # the torch forward's option
    srv = eng.serving
    srv.runner.forward.graphs = DecodeGraphs(eng.model, srv.pool, capture=False)
    arrivals = {0: [(p, {"max_new_tokens": 7}) for p in PROMPTS[:3]]}
    results, steps, _ = serve(eng, arrivals)
    assert set(srv.runner.graphs.steps) >= {4}  # batch 3 ran in the bucket of 4, one padding row
    for res, p in zip(results, PROMPTS[:3], strict=True):
        assert res.tokens == eng.generate([p], max_new_tokens=7).tokens[0]


def test_the_chef_serves_a_busy_kitchen_like_a_quiet_one():
    eng = Engine.load("chef", policy="chunked", token_budget=32)
    prompts = ["ROMEO:", "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?", "KING HENRY:"]
    arrivals = {i: [(p, {"max_new_tokens": 24})] for i, p in enumerate(prompts)}
    results, _, _ = serve(eng, arrivals)
    for res, p in zip(results, prompts, strict=True):
        assert res.text == eng.generate([p], max_new_tokens=24).texts[0] and res.text


@pytest.mark.parametrize(
    "load, submit, pattern",
    [
        ({"max_seq_len": 32}, (PROMPTS[2], {"max_new_tokens": 10}), "exceeds a KV seat of 32 tokens"),
        ({}, (list(range(100)), {"max_new_tokens": 40}), "exceeds the model's context of 128"),
        ({"kv_tokens": 30}, (PROMPTS[0], {"max_new_tokens": 40}), "exceeds the KV memory of 30 tokens"),
        ({"kv_budget_bytes": 60_000}, (list(range(80)), {"max_new_tokens": 8}), "prefill working memory"),
        ({}, (PROMPTS[0], {"native": False}), "applies to one order (generate/stream)"),
        ({}, ([PROMPTS[0], PROMPTS[1]], {}), "submit takes one prompt"),
        ({}, ([], {}), "prompt 1 is empty"),
        ({}, (PROMPTS[0], {"max_new_tokens": 0}), "max_new_tokens must be at least 1"),
        ({}, (PROMPTS[0], {"temperature": -1}), "temperature must be >= 0"),
        ({}, ([1, 999], {}), "token id 999"),
    ],
)
def test_submit_refuses_in_one_line_and_keeps_serving(tiny_llama, load, submit, pattern):
    eng = Engine.load(str(tiny_llama.path), **load)
    prompt, settings = submit
    with pytest.raises(EngineError) as err:
        eng.submit(prompt, **settings)
    assert pattern in str(err.value) and "\n" not in str(err.value)
    (res,), _, _ = serve(eng, {0: [(PROMPTS[1], {"max_new_tokens": 3})]})
    assert len(res.tokens) == 3


def test_a_seat_holds_prompt_plus_new_tokens_but_the_last(tiny_llama):
    """The last token is never fed back, so a seat of 32 slots serves a prompt of 22 + 11 new tokens,
    with the tokens it gets from an order of its own; one more new token is refused in one line."""
    eng = Engine.load(str(tiny_llama.path), max_seq_len=32)
    prompt = list(range(40, 62))  # 22 tokens
    (res,), _, _ = serve(eng, {0: [(prompt, {"max_new_tokens": 11, "stop_at_eos": False})]})
    assert res.tokens == eng.generate([prompt], max_new_tokens=11, stop_at_eos=False).tokens[0] and len(res.tokens) == 11
    with pytest.raises(EngineError, match=r"= 33 exceeds a KV seat of 32 tokens") as err:
        eng.submit(prompt, max_new_tokens=12)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "load, pattern",
    [({"policy": "fifo"}, "unknown policy 'fifo'"), ({"token_budget": 0}, "token_budget must be at least 1"),
     ({"max_seqs": 0}, "max_seqs must be at least 1")],  # fmt: skip
)
def test_bad_serving_settings_are_refused_at_load(tiny_llama, load, pattern):
    with pytest.raises(EngineError, match=pattern):
        Engine.load(str(tiny_llama.path), **load)


def test_step_on_an_idle_engine_does_nothing(tiny_llama):
    eng = Engine.load(str(tiny_llama.path))
    assert eng.idle and eng.step() == []


def test_compaction_moves_each_sequence_with_its_cache(tiny_llama):
    """Seats 1 and 3 decode while seat 0 holds a prompt mid-prefill: after compacting, the decoders
    sit in 0 and 1 and every sequence's K/V moved with it."""
    from engine.kv_pool import SeatPool

    eng = Engine.load(str(tiny_llama.path))
    pool = SeatPool(eng.cfg, 4, 16, torch.float32, "cpu")
    for rid, n in [(10, 5), (11, 7), (12, 2), (13, 3)]:
        seat = pool.take(rid)
        pool.k[:, seat, :, :n] = float(rid)
        pool.v[:, seat, :, :n] = -float(rid)
        pool.note_written(seat, n)
    pool.release(2)  # 12 finished
    pool.compact([1, 3])
    assert set(pool.owner[:2]) == {11, 13} and set(pool.owner[2:]) == {10, None}
    for seat, rid in enumerate(pool.owner):
        if rid is not None:
            n = pool.lengths[seat]
            assert n == {10: 5, 11: 7, 13: 3}[rid]
            assert (pool.k[:, seat, :, :n] == rid).all() and (pool.v[:, seat, :, :n] == -rid).all()


HOUSE = list(range(100, 160))  # a 60-token house prompt many orders share


@pytest.mark.parametrize("policy", POLICIES)
def test_prefix_reuse_changes_no_token_and_counts_its_hits(tiny, policy):
    """Orders sharing a prefix, arriving while others run (copy from a running seat) and after they
    finish (adopt a leftover seat): the same tokens as without reuse, and fewer prompt tokens computed."""
    arrivals = {0: [(HOUSE + [1, 2, 3], {"max_new_tokens": 6})], 3: [(HOUSE + [4, 5], {"max_new_tokens": 5})],
                30: [(HOUSE + [7], {"max_new_tokens": 4}), (HOUSE[:30] + [9, 9], {"max_new_tokens": 4})]}  # fmt: skip
    runs = {}
    for reuse in (False, True):
        eng = Engine.load(str(tiny.path), policy=policy, token_budget=32, prefix_cache=reuse)
        results, steps, _ = serve(eng, arrivals)
        runs[reuse] = (results, sum(s.prefill_tokens for s in steps), eng.serving_state())
    (cold, cold_prefill, _), (warm, warm_prefill, state) = runs[False], runs[True]
    assert [r.tokens for r in warm] == [r.tokens for r in cold]
    cached = [r.metrics.cached_tokens for r in warm]
    assert cached[0] == 0 and all(c >= 30 for c in cached[1:]) and cached[3] == 30
    assert warm_prefill == cold_prefill - sum(cached)
    assert state.prefix_hits == sum(cached) and state.prefix_queries == sum(len(p) for s in arrivals.values() for p, _ in s)


def test_leftovers_give_way_to_new_orders_before_anyone_is_preempted(tiny_llama):
    """Two seats and KV for 80 tokens: leftovers are evicted for seats and memory, never a running order."""
    eng = Engine.load(str(tiny_llama.path), policy="continuous", max_seqs=2, kv_tokens=80, prefix_cache=True)
    arrivals = {i * 12: [([200 + i] * 20, {"max_new_tokens": 8})] for i in range(6)}
    results, steps, _ = serve(eng, arrivals)
    assert not [r for s in steps for r in s.preempted]
    pool = eng.serving.pool
    assert pool.free_seats + len(eng.serving.prefix.leftovers) == 2 and len(eng.serving.prefix.leftovers) >= 1
    for res, (prompt, s) in zip(results, [a[0] for _, a in sorted(arrivals.items())], strict=True):
        assert res.tokens == eng.generate([prompt], **s).tokens[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_cuda_serving_replays_graph_buckets_with_the_cpu_tokens(tiny_llama, policy):
    """On CUDA the decode steps replay captured graphs (buckets 1, 2, 4, ...), padded rows and all,
    and every request gets the tokens the CPU's eager serving path gives it."""
    arrivals = {0: [(PROMPTS[0], {"max_new_tokens": 12})], 2: [(PROMPTS[1], {"max_new_tokens": 20})],
                5: [(PROMPTS[2], {"max_new_tokens": 6}), (PROMPTS[3], {"max_new_tokens": 9})]}  # fmt: skip
    cpu, _, _ = serve(Engine.load(str(tiny_llama.path), policy=policy, token_budget=16), arrivals)
    gpu_engine = Engine.load(str(tiny_llama.path), device="cuda", policy=policy, token_budget=16)
    gpu, _, _ = serve(gpu_engine, arrivals)
    assert [r.tokens for r in gpu] == [r.tokens for r in cpu]
    graphs = gpu_engine.serving.runner.graphs
    assert graphs is not None and graphs.steps and not graphs.failed  # captured, replayed, none broke
    assert {1, 2} <= set(graphs.steps)  # one request alone, then two: two buckets


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_orders_on_seats_match_the_fixed_batch(tiny_qwen2):
    """An order through generate() (engine/request_group.py) on CUDA: the fixed batch's tokens
    (float32: in bfloat16 the two kitchens' different reduction widths may flip a near-tie)."""
    from engine.limits import RequestSettings
    from lab.kitchens import FixedBatch

    eng = Engine.load(str(tiny_qwen2.path), device="cuda")
    prompts = [[11, 57, 3, 200, 42, 9], [5, 6, 77, 8, 1, 300]]
    seats = eng.generate(prompts, max_new_tokens=12, stop_at_eos=False)
    req = RequestSettings(max_new_tokens=12, stop_at_eos=False)
    (done,) = [e for e in FixedBatch(eng.model, eng.codec, eng.info, prompts, req, 0).events() if isinstance(e, Done)]
    assert seats.path == "seats" and seats.tokens == done.result.tokens
