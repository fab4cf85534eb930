"""The serving labs' compute functions on the embedded chef: dinner rush, don't stall the pot, leftovers.

What is asserted: facts that hold by construction of the scheduler (static admits whole batches,
continuous lets tickets join mid-service, exact output lengths, cached tokens equal the shared
prefix, the hit rate is vLLM's token ratio, the passes a banquet takes and the tokens the tables
wait through), and timing facts only where the gap is structural and wide (a ticket waiting for a
whole batch against one that joins at once; a 384-token prefill pass against a decode step), with
the measured values stated beside each margin. A comparison of two runs' seconds whose gap is
narrow (chunked prefill's later banquet) is asserted in passes: a busy neighbour reorders such
seconds. Torch runs single-threaded, as in test_lab_compute.py (a loaded 2-core machine).
"""

import pytest
from conftest import CHEF_CONTEXT, travels

from engine.errors import EngineError
from lab.dinner_rush import RushSettings, run_dinner_rush, rush_figures, rush_verdict
from lab.leftovers import LeftoversSettings, leftovers_figures, leftovers_verdict, run_leftovers
from lab.stall import StallSettings, run_stall, stall_figures, stall_verdict


def test_dinner_rush_static_serves_whole_batches_continuous_lets_tickets_join(chef_one_thread):
    seen = []
    s = RushSettings(requests=24, rate=80.0, long_answer=96, long_every=4)
    r = run_dinner_rush(chef_one_thread, s, seen.append)
    travels(r)
    assert [run.policy for run in r.runs] == ["static", "continuous"] and [p.done for p in seen] == [1, 2]
    for run in r.runs:
        assert len(run.served.results) == 24 == run.report.requests
        wanted = [res.metrics.output_tokens for res in run.served.results]
        assert all(len(res.tokens) == n for res, n in zip(run.served.results, wanted, strict=True))
        assert set(wanted) <= {s.short_answer, s.long_answer}
        assert run.report.requests_per_s == pytest.approx(24 / run.served.span_s)

    def joined_mid_service(steps) -> int:
        """Steps where a ticket joined while others kept cooking (neither a subset nor a new batch)."""
        held = [set(st.request_ids) for st in steps]
        return sum(1 for a, b in zip(held, held[1:], strict=False) if not b <= a and a & b)

    assert joined_mid_service(r.run("static").served.steps) == 0  # a batch only ever shrinks
    assert joined_mid_service(r.run("continuous").served.steps) > 0
    # The same orders, same arrivals: under static a ticket waits for the batch's long order (measured
    # TTFT p50 ~150-650 ms), under continuous it joins at once (~10 ms). Margin: continuous below static.
    assert r.run("continuous").report.ttft_s["p50"] < r.run("static").report.ttft_s["p50"]
    assert r.speedup == pytest.approx(
        r.run("continuous").report.requests_per_s / r.run("static").report.requests_per_s
    )
    assert set(r.tickets_frame().policy) == {"static", "continuous"} and len(r.tickets_frame()) == 48
    assert len(rush_figures(r, 2.0)) == 3
    assert rush_verdict(r).evidence[0].startswith("static: ")


def test_a_banquet_stalls_the_pot_under_continuous_and_chunks_flatten_it(chef_one_thread):
    s = StallSettings(
        tables=3, table_answer=24, join_after=6, banquet_prompt=384, budgets=(16, 128), repeats=2
    )
    r = run_stall(chef_one_thread, s)
    travels(r)
    assert [(x.policy, x.token_budget) for x in r.runs] == [
        ("continuous", 387),
        ("chunked", 16),
        ("chunked", 128),
    ]
    assert all(len(x.itl_s) == 23 for x in r.runs)  # one gap between each pair of the tables' 24 tokens
    cont, small = r.runs[0], r.runs[1]
    # The lesson in the scheduler's passes, the same on any machine at any load. Continuous: the
    # 384-token prompt is one pass that the tables wait through, and the banquet's first token comes
    # from that one pass. Chunked at 16 tokens per step: no pass the tables wait through holds more
    # than the budget (the flat pot), and the prompt takes at least 384 / 16 passes (the later banquet;
    # measured 28, its TTFT 1.6-1.8x continuous's, a gap a busy neighbour has reversed in seconds).
    assert cont.banquet_passes == 1 and cont.stall_tokens >= s.banquet_prompt
    assert small.stall_tokens <= small.token_budget < s.banquet_prompt
    assert small.banquet_passes >= -(-s.banquet_prompt // small.token_budget) > cont.banquet_passes
    # The clock, where the gap is structural and wide: the 384-token pass against a 3-token decode
    # step (measured 15-20x the usual gap on a quiet machine, 28-33x at load average 10.5).
    assert cont.itl_max_s > 3 * cont.itl_p50_s
    assert list(r.to_frame().columns) == [
        "policy",
        "token_budget",
        "banquet_ttft_s",
        "itl_p50_s",
        "itl_max_s",
        "spike",
        "banquet_passes",
        "stall_tokens",
    ]
    timeline, trade = stall_figures(r, 5.0)
    # The trade-off's points are named in the legend, never labelled on the plot, where a budget
    # measured beside continuous's point printed its label over continuous's.
    named = [t.name for t in trade.data if t.mode == "markers"]
    assert named == ["chunked, budget 16", "chunked, budget 128", "continuous (whole banquet)"]
    assert not any("text" in (t.mode or "") for t in trade.data)
    assert "continuous" in stall_verdict(r).evidence[0]


def test_leftovers_reuse_exactly_the_shared_prefix_and_count_hits_by_token(chef_one_thread):
    s = LeftoversSettings(prompt_len=300, shares=(0.5, 0.9), repeats=3, orders=8, max_seqs=2)
    r = run_leftovers(chef_one_thread, s)
    travels(r)
    assert [t.shared_tokens for t in r.timings] == [150, 270]
    assert [t.warm_cached_tokens for t in r.timings] == [150, 270]  # the house prefix, not a token more
    # 90 % cached: the wok tosses 30 tokens instead of 300 (measured 0.2-0.3x); margin 0.6x.
    assert r.most_cached.ratio < 0.6
    assert r.stream[0].cached_tokens == 0  # the first order finds nothing
    assert all(o.cached_tokens >= 270 for o in r.stream[1:])  # every later one finds the house stock
    prompt_tokens = s.orders * s.prompt_len  # looked up once each (two seats hold every stream here)
    assert r.hit_rate == pytest.approx(sum(o.cached_tokens for o in r.stream) / prompt_tokens)
    assert 0 < r.kv_held_end <= s.max_seqs * (s.prompt_len + s.answer)  # leftovers, within the seats
    # Without reuse a finished order's seat is freed: nothing is held once the stream is served.
    assert r.held["without reuse"][-1][1] == 0 < r.held["with reuse"][-1][1] == r.kv_held_end
    assert len(leftovers_figures(r, 25.0)) == 3
    assert leftovers_verdict(r).slow_phase == "prefill"


@pytest.mark.parametrize(
    "call, words",
    [
        (
            lambda e: run_dinner_rush(e, RushSettings(prompt_max=CHEF_CONTEXT - 112, long_answer=200)),
            f"the model's context is {CHEF_CONTEXT}",
        ),
        (lambda e: run_dinner_rush(e, RushSettings(requests=1)), "requests must be between 2 and 400"),
        (
            lambda e: run_stall(e, StallSettings(tables=8, budgets=(8, 64))),
            "must exceed the 8 decoding tables",
        ),
        (lambda e: run_stall(e, StallSettings(banquet_prompt=CHEF_CONTEXT + 88)), f"the model's context is {CHEF_CONTEXT}"),
        (lambda e: run_stall(e, StallSettings(join_after=40)), "the banquet must arrive after 1 to 36"),
        (lambda e: run_leftovers(e, LeftoversSettings(shares=(1.0,))), "between 0 and 1"),
        (lambda e: run_leftovers(e, LeftoversSettings(prompt_len=CHEF_CONTEXT + 8)), f"the model's context is {CHEF_CONTEXT}"),
    ],
)
def test_bad_serving_settings_are_refused_in_one_line(chef_one_thread, call, words):
    with pytest.raises(EngineError) as err:
        call(chef_one_thread)
    assert words in str(err.value) and "\n" not in str(err.value)
