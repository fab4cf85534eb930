"""An order (generate / stream) on the serving core cooks what one fixed batch cooks.

The reference is the lab's fixed batch (lab/kitchens.py: the same forward over seats 0..B-1 with
one common slot per step), which the parity tests hold against HF transformers: same tokens greedy
and sampled, same passes in the trace, same events.
"""


import pytest
from conftest import with_eos

from engine import Engine, EngineError
from engine.events import Done, PrefillEnd, PrefillStart, StepEnd, Token
from engine.limits import RequestSettings
from lab import kitchens
from lab.kitchens import FixedBatch, on_seats

SAME = [[11, 57, 3, 200, 42, 9], [5, 6, 77, 8, 1, 300], [300, 1, 2, 99, 45, 2]]  # one length: the Kitchen's
MIXED = [[11, 57, 3, 200, 42, 9, 101, 7], [5, 6], [300, 1, 2, 99, 45]]


def fixed(eng: Engine, prompts, batching: str = "packed", **settings) -> list:
    """The same order as one fixed batch (the lab's kitchen), bypassing the lab's choice."""
    req = RequestSettings(**settings)
    return list(FixedBatch(eng.model, eng.codec, eng.info, prompts, req, 0, "static", batching).events())


def result(events):
    (done,) = [ev for ev in events if isinstance(ev, Done)]
    return done.result


def shape(res):
    """What each traced pass did, without its times."""
    return [(s.phase, s.batch, s.tokens, s.slots, s.kv_tokens, s.kv_bytes, s.flops) for s in res.trace.steps]


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen2", "tiny_gpt2"])
@pytest.mark.parametrize("prompts,batching", [(SAME, "padded"), (MIXED, "packed")])
def test_an_order_on_seats_equals_the_fixed_batch(request, family, prompts, batching):
    eng = Engine.load(str(request.getfixturevalue(family).path))
    for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "top_k": 50, "seed": 7}):
        kw = dict(max_new_tokens=12, stop_at_eos=False) | sampling
        ours = eng.generate(prompts, **kw)
        ref = result(fixed(eng, prompts, batching, **kw))
        assert ours.path == "seats" and ref.path == "fixed batch"
        assert ours.tokens == ref.tokens, sampling
        if prompts is SAME:
            assert shape(ours) == shape(ref)
        else:  # one decode slot per step for all rows: the fixed batch reads the longest row's width
            assert [s[:4] for s in shape(ours)] == [s[:4] for s in shape(ref)]
            for step, (s, r) in enumerate(zip(ours.trace.decode_steps, ref.trace.decode_steps, strict=True)):
                assert s.kv_tokens == sum(len(p) + step + 1 for p in prompts) < r.kv_tokens
        assert ours.metrics.kv_cache_allocated_bytes == ref.metrics.kv_cache_allocated_bytes
        assert ours.metrics.kv_cache_bytes == ref.metrics.kv_cache_bytes


def test_the_events_come_in_the_fixed_batch_order(tiny_llama):
    eng = Engine.load(str(tiny_llama.path))
    kw = dict(max_new_tokens=4, stop_at_eos=False)
    ours = list(eng.stream(SAME, **kw))
    ref = fixed(eng, SAME, **kw)

    def kinds(events):
        return [(type(ev).__name__, getattr(ev, "seq", None), getattr(ev, "step", None) if isinstance(ev, Token)
                 else None) for ev in events]  # fmt: skip

    assert kinds(ours) == kinds(ref)
    assert isinstance(ours[0], PrefillStart) and isinstance(ours[1], PrefillEnd) and isinstance(ours[-1], Done)
    assert ours[0].slots == sum(map(len, SAME)) and ours[0].prompt_tokens == [6, 6, 6]
    assert ours[1].kv_bytes == ours[1].step.kv_bytes > 0
    ends = [ev for ev in ours if isinstance(ev, StepEnd)]
    assert [e.step.phase for e in ends] == ["prefill", "decode", "decode", "decode"]
    assert len({ev.request_id for ev in ours}) == 1  # every event names the order


def test_a_finished_table_leaves_its_seat(tiny_llama, tmp_path):
    eng = Engine.load(str(tiny_llama.path))
    free = eng.generate(SAME, max_new_tokens=10).tokens
    eos = free[0][3]  # declare table 0's 4th token the end-of-sequence token
    eng = Engine.load(str(with_eos(tiny_llama, eos, tmp_path / "with_eos")))
    res = eng.generate(SAME, max_new_tokens=10)
    assert res.path == "seats"
    assert res.tokens == result(fixed(eng, SAME, max_new_tokens=10)).tokens
    assert res.tokens[0] == free[0][:4]
    batches = [s.batch for s in res.trace.decode_steps]
    assert batches[0] == len(SAME) and batches[-1] < len(SAME)  # the finished table stopped costing a row


def test_which_orders_run_on_seats(tiny_llama):
    one, mixed = [[1, 2], [3, 4]], [[1, 2, 3], [4]]
    assert on_seats("static", "packed", one) and on_seats("static", "padded", one)
    assert on_seats("static", "packed", mixed)  # packed, the default: the seats never pad
    assert not on_seats("static", "padded", mixed)  # the padding lesson pads for real
    assert not on_seats("growing", "packed", one)
    assert not on_seats("none", "packed", one)
    eng = Engine.load(str(tiny_llama.path))  # the lessons' knobs are the lab's: the engine does not know them
    for settings in ({"cache": "growing"}, {"batching": "padded"}):
        with pytest.raises(EngineError, match=f"unknown setting '{next(iter(settings))}'") as err:
            eng.generate(mixed, max_new_tokens=2, **settings)
        assert "\n" not in str(err.value)
    for settings, words in [({"cache": "fridge"}, "unknown cache mode 'fridge'"),
                            ({"batching": "stacked"}, "unknown batching 'stacked'")]:  # fmt: skip
        with pytest.raises(EngineError, match=words):
            kitchens.generate(eng, mixed, max_new_tokens=2, **settings)


def test_the_chef_cooks_the_kitchens_order_on_seats():
    eng = Engine.load("chef")
    res = eng.generate(["ROMEO:"] * 4, max_new_tokens=24, temperature=0.8, seed=3)
    assert res.path == "seats"
    assert res.tokens == result(fixed(eng, [eng.encode("ROMEO:")] * 4, max_new_tokens=24, temperature=0.8,
                                      seed=3)).tokens  # fmt: skip
    assert all(res.texts) and res.metrics.ttft_s > 0 and res.metrics.tpot_s > 0


def test_equal_prompts_take_one_batched_prefill_pass(tiny_qwen2, monkeypatch):
    """The forward's wok on seats is laid out (B, T) like the fixed batch's, and its K/V serve the decode.
    (The native step, the CPU default, takes any layout as rows: this is the op-by-op path's.)"""
    import engine.torch_forward as forward_mod

    layouts, real = [], forward_mod.SeatKV

    def seat_kv(sb, pool, *rest):  # one per pass of the torch forward: is it laid out (B, T)?
        layouts.append(sb.uniform)
        return real(sb, pool, *rest)

    monkeypatch.setattr(forward_mod, "SeatKV", seat_kv)
    eng = Engine.load(str(tiny_qwen2.path), native=False)
    kw = dict(max_new_tokens=8, stop_at_eos=False)
    assert eng.generate(SAME, **kw).tokens == result(fixed(eng, SAME, **kw)).tokens
    assert layouts == [True] + [False] * 7
    layouts.clear()
    eng.generate(MIXED, **kw)  # mixed lengths: one span per prompt
    assert layouts[0] is False


def test_the_labs_kitchens_refuse_in_one_line(tiny_llama):
    """The lab's kitchens share the engine's checks, and a CUDA graph is the seats' alone."""
    from lab import kitchens

    eng = Engine.load(str(tiny_llama.path))
    for settings, words in [({"cache": "growing", "cuda_graph": True}, "cuda_graph=True replays the seats"),
                            ({"cache": "cold"}, "cache"), ({"batching": "zigzag"}, "batching")]:  # fmt: skip
        with pytest.raises(EngineError, match=words) as err:
            kitchens.generate(eng, MIXED, max_new_tokens=2, **settings)
        assert "\n" not in str(err.value)
    res = kitchens.generate(eng, MIXED, max_new_tokens=3, cache="growing")
    assert res.path == "fixed batch" and res.tokens == eng.generate(MIXED, max_new_tokens=3).tokens


@pytest.mark.parametrize("kitchen", [{}, {"cache": "growing"}, {"cache": "none"}, {"batching": "padded"}])
def test_each_table_samples_its_prompt_alone_with_seed_plus_its_index(tiny_llama, kitchen):
    """One sampling rule everywhere: table i draws from its own generator seeded seed + i, so its
    tokens are its prompt's served alone with that seed, in the engine's kitchen and the lab's."""
    from lab import kitchens

    eng = Engine.load(str(tiny_llama.path))
    kw = dict(max_new_tokens=10, temperature=0.9, top_p=0.95, stop_at_eos=False)
    prompts = MIXED  # a padded batch of mixed lengths is the lab's, as are the other caches
    res = kitchens.generate(eng, prompts, seed=5, **kw, **kitchen)
    assert res.path == ("seats" if not kitchen else "fixed batch")
    alone = [eng.generate([p], seed=5 + i, **kw).tokens[0] for i, p in enumerate(prompts)]
    assert res.tokens == alone
    assert len({tuple(t) for t in res.tokens}) == len(prompts)  # the draws really differ between tables


def test_an_orders_seats_are_freed_when_it_ends(tiny_llama, monkeypatch):
    """No reference cycle holds an order's engine: its KV seats go back at once, not at the next
    garbage-collector pass (the next order would otherwise take fresh pages and fault them in)."""
    import gc
    import weakref

    import engine.kv_pool as kv_pool

    pools, real = [], kv_pool.SeatPool.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        pools.append(weakref.ref(self))

    monkeypatch.setattr(kv_pool.SeatPool, "__init__", init)
    eng = Engine.load(str(tiny_llama.path))
    gc.disable()
    try:
        eng.generate(MIXED, max_new_tokens=4)
        assert len(pools) == 1 and pools[0]() is None
    finally:
        gc.enable()
