"""The inspector on constructed measurement sets, one per verdict.

Each set is a real `Trace` built step by step with the numbers a run of that kind produces, then
turned into `Metrics` by the project's own `compute_metrics`, so the inspector sees exactly what it
sees after a real run.
"""

from engine.bench.roofline import Roofline
from engine.trace import StepRecord, Trace, compute_metrics
from lab.inspector import diagnose
from lab.serving_verdicts import (
    PolicyNumbers,
    StallNumbers,
    diagnose_leftovers,
    diagnose_rush,
    diagnose_stall,
)

# A machine with 20 GB/s and 100 GFLOP/s: ridge at 5 FLOP/byte.
ROOF = Roofline(bandwidth_bytes_per_s=20e9, flops_per_s=100e9, device="cpu", dtype="float32")


def build_trace(
    *,
    prefill_s: float,
    steps: int,
    step_s: float,
    forward_share: float,
    batch: int = 1,
    prompt: int = 32,
    slots: int | None = None,
    decode_flops: float = 2e6,
    decode_bytes: float = 4e6,
    decode_tokens_per_seq: int = 1,
) -> tuple[Trace, list[int]]:
    """A prefill pass then `steps` equal decode steps; returns the trace and tokens per sequence."""
    trace = Trace()
    slots = slots if slots is not None else prompt * batch
    pre = StepRecord(
        "prefill",
        0,
        0.0,
        prefill_s,
        prefill_s * 0.95,
        batch,
        prompt * batch,
        slots,
        prompt * batch,
        1000,
        1e9,
        1e7,
    )
    trace.steps.append(pre)
    trace.t_first_token = prefill_s
    t = prefill_s
    for i in range(1, steps + 1):
        trace.steps.append(
            StepRecord(
                "decode",
                i,
                t,
                t + step_s,
                step_s * forward_share,
                batch,
                batch * decode_tokens_per_seq,
                batch * decode_tokens_per_seq,
                batch * (prompt + i),
                1000 + i,
                decode_flops,
                decode_bytes,
            )
        )
        t += step_s
    trace.t_done = t
    return trace, [steps + 1] * batch


def verdict_for(roof=ROOF, **kw):
    trace, out = build_trace(**kw)
    return diagnose(compute_metrics(trace, out, kv_allocated=4096), trace, roof)


def test_long_prompt_makes_the_wok_the_bottleneck():
    v = verdict_for(prefill_s=2.0, steps=10, step_s=0.01, forward_share=0.9, prompt=1024)
    assert v.slow_phase == "prefill"
    assert v.headline.startswith("TTFT is 95% of the wait: the wok is the bottleneck")
    assert any("1024 prompt tokens" in f for f in v.fixes)
    assert any("TTFT 2.00 s" in e for e in v.evidence)


def test_heavy_padding_suggests_packing():
    v = verdict_for(prefill_s=1.0, steps=2, step_s=0.01, forward_share=0.9, batch=4, prompt=50, slots=400)
    assert v.slow_phase == "prefill"
    assert any("packed" in f for f in v.fixes)
    assert any("(50% padding)" in e for e in v.evidence)


def test_bandwidth_bound_decode():
    # 4 MB per step at 20 GB/s = 0.2 ms of roof time; a 0.25 ms step is 80 % explained by bytes.
    v = verdict_for(prefill_s=0.01, steps=100, step_s=0.00025, forward_share=0.9)
    assert v.slow_phase == "decode"
    assert v.decode_bound == "bandwidth"
    assert "soup pot is the bottleneck" in v.headline
    assert not any("bfloat16" in f for f in v.fixes)  # no dtype advice without this machine's measurements


def test_compute_bound_decode_at_large_batch():
    # 64 sequences: 1.28 GFLOP over 40 MB = 32 FLOP/byte, right of the 5 FLOP/byte ridge.
    v = verdict_for(
        prefill_s=0.01,
        steps=50,
        step_s=0.015,
        forward_share=0.95,
        batch=64,
        decode_flops=1.28e9,
        decode_bytes=40e6,
    )
    assert v.decode_bound == "compute"
    assert any("compute-bound" in f for f in v.fixes)
    # The headline names the regime with its numbers, and when the story's memory-bound pot holds:
    # 1.28 GFLOP / 64 = 20 MFLOP a table; ~40 MB of weights; ridge 5: 5 x 40 MB / 20 MFLOP = batch 10.
    assert ("each step is compute-bound at this batch: 64 tables share each weight read, 32.0 FLOP/byte, "
            "right of the DRAM ridge at 5.0 FLOP/byte; memory-bound below about batch 10") in v.headline  # fmt: skip


def test_the_pot_at_batch_1_is_named_memory_bound_with_the_batch_it_turns():
    # 2 MFLOP over 4 MB = 0.5 FLOP/byte at batch 1, ridge 5: 5 x ~4 MB / 2 MFLOP = about batch 10-11.
    v = verdict_for(prefill_s=0.01, steps=100, step_s=0.00025, forward_share=0.9)
    assert v.decode_bound == "bandwidth"
    assert ("each step waits on reading weights and KV cache, like the story's pot: memory-bound at batch 1: "
            "0.50 FLOP/byte, left of the DRAM ridge at 5.0 FLOP/byte; compute-bound from about batch 11") in v.headline  # fmt: skip


def test_an_overhead_bound_pot_still_says_which_side_of_the_ridge_it_sits():
    v = verdict_for(prefill_s=0.01, steps=50, step_s=0.005, forward_share=0.9)
    assert v.decode_bound == "overhead" and "per-step overhead" in v.headline
    assert "by its intensity alone the pot is memory-bound at batch 1: 0.50 FLOP/byte" in " ".join(v.evidence)


def test_the_regimes_crossing_follows_from_the_step_and_the_ridge():
    from lab.inspector import regime

    trace, _ = build_trace(prefill_s=0.01, steps=1, step_s=0.02, forward_share=0.9, batch=8,
                           decode_flops=8 * 0.27e9, decode_bytes=538e6 + 8 * 2e6)  # fmt: skip
    step = trace.decode_steps[0]
    r = regime(step, ROOF)  # ridge 5; per table 0.27 GFLOP and ~1 kB of KV (build_trace's kv_bytes)
    weights = step.bytes_moved - step.kv_bytes
    assert r.bound == "bandwidth" and r.memory == "DRAM" and r.ridge == 5.0
    assert r.crossing == -(-5 * weights // (0.27e9 - 5 * step.kv_bytes / 8))  # the ceiling of R W / (f - R k)
    assert r.intensity < r.ridge <= r.crossing * 0.27e9 / weights
    heavy_kv = StepRecord("decode", 1, 0.0, 0.01, 0.009, 4, 4, 4, 4000, 4 * 10**9, 4 * 2e6, 4 * 10**9 + 1e6)
    assert regime(heavy_kv, ROOF).crossing is None  # the KV cache outweighs the FLOPs: no batch crosses


def test_a_step_whose_bytes_fit_in_a_measured_cache_is_judged_against_that_caches_ridge():
    from engine.bench.roofline import MemoryRoof

    cached = Roofline(20e9, 100e9, "cpu", "float32", caches=(MemoryRoof("L3", 50e9, 32 * 2**20),))
    trace, out = build_trace(prefill_s=0.001, steps=50, step_s=0.0001, forward_share=0.95)  # 4 MB: in the L3
    v = diagnose(compute_metrics(trace, out, kv_allocated=4096), trace, cached)
    assert v.decode_bound == "bandwidth"
    assert "left of the L3 ridge at 2.0 FLOP/byte" in v.headline
    assert any("its bytes come from L3, whose roof was measured: its 4 MB fit there" in e for e in v.evidence)


def test_overhead_bound_when_most_of_the_step_is_outside_forward():
    v = verdict_for(prefill_s=0.01, steps=50, step_s=0.006, forward_share=0.3)
    assert v.decode_bound == "overhead"
    assert any("70% outside the forward pass" in e for e in v.evidence)
    assert any("CUDA graph" in f for f in v.fixes)


def test_overhead_bound_when_roof_explains_little_of_the_step():
    # Forward is 90 % of the step, but 4 MB at 20 GB/s is 0.2 ms of a 5 ms step: 4 % explained.
    v = verdict_for(prefill_s=0.01, steps=50, step_s=0.005, forward_share=0.9)
    assert v.decode_bound == "overhead"
    assert any("explains 4% of the step time" in e for e in v.evidence)


def test_without_roofline_bandwidth_and_compute_stay_undecided():
    v = verdict_for(roof=None, prefill_s=0.01, steps=100, step_s=0.00025, forward_share=0.9)
    assert v.slow_phase == "decode"
    assert v.decode_bound is None
    assert any("no roofline" in e for e in v.evidence)


def test_recompute_without_cache_is_called_out():
    v = verdict_for(prefill_s=0.01, steps=50, step_s=0.02, forward_share=0.95, decode_tokens_per_seq=40)
    assert any("Use a KV cache" in f for f in v.fixes)


def test_single_token_run_has_no_decode_verdict():
    v = verdict_for(prefill_s=0.05, steps=0, step_s=0.0, forward_share=1.0)
    assert v.slow_phase == "prefill"
    assert v.decode_bound is None


def test_a_large_batch_step_faster_than_the_compute_roof_names_that_roof():
    # 1.28 GFLOP at 100 GFLOP/s needs 12.8 ms; a 10 ms step beat the compute roof, not the memory one.
    v = verdict_for(prefill_s=0.01, steps=50, step_s=0.010, forward_share=0.95, batch=64,
                    decode_flops=1.28e9, decode_bytes=40e6)  # fmt: skip
    assert v.decode_bound == "compute"
    assert any(e.startswith("the step beat the measured compute roof (100.0 GFLOP/s") for e in v.evidence)
    assert not any("memory roof" in e for e in v.evidence)


def test_a_step_faster_than_the_memory_roof_is_called_out():
    # 4 MB at 20 GB/s needs 0.2 ms; a 0.1 ms step must have read from a cache.
    v = verdict_for(prefill_s=0.001, steps=100, step_s=0.0001, forward_share=0.95)
    assert v.decode_bound == "bandwidth"
    assert any("beat the measured memory roof" in e for e in v.evidence)


# -- advice follows this machine's measurements ---------------------------------------


def bandwidth_verdict(**kw):
    """A pot that sits left of the ridge with the roof explaining most of its step."""
    trace, out = build_trace(prefill_s=0.005, steps=40, step_s=0.0004, forward_share=0.9, **kw)
    return trace, out


def test_no_smaller_dtype_advice_where_it_measured_slower_here():
    trace, out = bandwidth_verdict()
    m = compute_metrics(trace, out, kv_allocated=4096)
    v = diagnose(m, trace, ROOF, dtype="float32", dtype_tpot={"float32": 0.0026, "bfloat16": 0.0045})
    assert v.decode_bound == "bandwidth", v
    assert not any("halves" in f for f in v.fixes)
    assert any(
        f.startswith("A smaller dtype does not help this pot here: measured TPOT bfloat16 4.5 ms")
        for f in v.fixes
    )


def test_smaller_dtype_advice_where_it_measured_faster_here_and_a_probe_where_unmeasured():
    trace, out = bandwidth_verdict()
    m = compute_metrics(trace, out, kv_allocated=4096)
    faster = diagnose(m, trace, ROOF, dtype="float32", dtype_tpot={"float32": 0.004, "bfloat16": 0.002})
    assert any("bfloat16 measured TPOT 2.0 ms against 4.0 ms" in f for f in faster.fixes)
    unknown = diagnose(m, trace, ROOF, dtype="float32")
    assert any("not measured yet" in f for f in unknown.fixes)


def test_int8_weights_are_a_smaller_portion_the_inspector_can_point_to():
    trace, out = bandwidth_verdict()
    m = compute_metrics(trace, out, kv_allocated=4096)
    measured = {"float32": 0.004, "bfloat16": 0.0045, "int8": 0.003}  # this machine's run log
    v = diagnose(m, trace, ROOF, dtype="float32", dtype_tpot=measured)
    assert any("int8 measured TPOT 3.0 ms against 4.0 ms" in f for f in v.fixes)  # the fastest measured
    from_bf16 = diagnose(m, trace, ROOF, dtype="bfloat16")
    assert any("switch Precision to int8" in f for f in from_bf16.fixes)
    assert not any("Precision" in f for f in diagnose(m, trace, ROOF, dtype="int8").fixes)  # nothing smaller


def test_one_table_is_not_told_to_split_the_banquet():
    v = verdict_for(prefill_s=2.0, steps=10, step_s=0.01, forward_share=0.9, prompt=1024, batch=1)
    assert v.slow_phase == "prefill" and not any("Split the banquet" in f for f in v.fixes)
    v = verdict_for(prefill_s=2.0, steps=10, step_s=0.01, forward_share=0.9, prompt=1024, batch=4)
    assert any(f.startswith("Split the banquet: 4 sequences") for f in v.fixes)


def test_a_lesson_about_the_pot_diagnoses_the_pot_even_when_the_wok_took_longer():
    trace, out = build_trace(prefill_s=2.0, steps=10, step_s=0.01, forward_share=0.9, prompt=1024)
    m = compute_metrics(trace, out, kv_allocated=4096)
    assert diagnose(m, trace, ROOF).slow_phase == "prefill"
    v = diagnose(m, trace, ROOF, focus="decode")
    assert v.slow_phase == "decode" and v.headline.startswith("The soup pot (10 steps")


# -- the serving labs' verdicts, on constructed streams ----------------------------------


def rush(policy, rps, ttft_p50, ttft_p99, tpot, e2e):
    return PolicyNumbers(policy, rps, ttft_p50, ttft_p99, tpot, e2e)


def test_rush_credits_continuous_batching_and_names_its_costs():
    static = rush("static", 24.0, 0.60, 1.2, 0.006, 0.70)
    continuous = rush("continuous", 44.0, 0.010, 0.080, 0.0078, 0.06)
    v = diagnose_rush(static, continuous)
    assert v.headline.startswith("Continuous batching served 1.8x the requests/s of static")
    assert v.slow_phase == "decode" and v.decode_bound is None
    assert any(f.startswith("Each ladle got 1.3x slower") for f in v.fixes)  # 7.8 vs 6.0 ms TPOT
    assert any("Don't stall the pot" in f for f in v.fixes)  # p99 80 ms > 5 x p50 10 ms
    assert v.evidence[0] == "static: 24.00 requests/s, TTFT p50 600.0 ms / p99 1200.0 ms, TPOT p50 6.0 ms"


def test_rush_too_light_to_tell_and_static_ahead():
    static = rush("static", 10.0, 0.02, 0.03, 0.005, 0.1)
    even = diagnose_rush(static, rush("continuous", 10.5, 0.02, 0.03, 0.005, 0.1))
    assert even.headline.startswith("The rush was too light to tell them apart: continuous served 1.05x")
    ahead = diagnose_rush(static, rush("continuous", 5.0, 0.02, 0.03, 0.005, 0.1))
    assert ahead.headline.startswith("Static batching served 2.0x the requests/s of continuous")


def stall_runs(cont_max, chunk_maxes):
    runs = [StallNumbers("continuous", 388, 0.043, 0.003, cont_max)]
    for budget, ttft, worst in chunk_maxes:
        runs.append(StallNumbers("chunked", budget, ttft, 0.003, worst))
    return runs


def test_stall_names_the_cheapest_budget_that_flattens_the_pot():
    # Continuous: 54 ms worst gap, 18x the usual 3 ms. Budgets 16 and 32 stay under 2x; 32 is sooner.
    runs = stall_runs(0.054, [(256, 0.044, 0.027), (16, 0.150, 0.004), (32, 0.090, 0.0055)])
    v = diagnose_stall(runs)
    assert v.headline.startswith(
        "The banquet stalled the pot: a 54.0 ms gap (18.0x the usual) under continuous"
    )
    assert "budget of 32 kept it to 1.8x, for a banquet TTFT of 90.0 ms instead of 43.0 ms" in v.headline
    assert v.fixes[0].startswith("Use chunked prefill with a token budget of 32")
    assert [e.split(":")[0] for e in v.evidence] == [
        "continuous", "chunked (budget 16)", "chunked (budget 32)", "chunked (budget 256)"
    ]  # fmt: skip


def test_stall_without_a_spike_or_without_a_flat_budget():
    calm = diagnose_stall(stall_runs(0.005, [(64, 0.05, 0.004)]))  # 1.7x: no stall
    assert calm.headline.startswith("No stall to fix")
    stuck = diagnose_stall(stall_runs(0.054, [(64, 0.05, 0.010), (128, 0.045, 0.02)]))
    assert stuck.headline.endswith("no budget tried kept the worst gap under 2x")


def test_leftovers_meets_the_goal_helps_partly_or_not_at_all():
    met = diagnose_leftovers(0.037, 0.0073, 0.9, 0.84, 7_500_000)
    assert met.headline.startswith("With 90% of the order already cooked, the first dish came in 0.20x")
    assert met.slow_phase == "prefill"
    assert (
        "84% of prompt tokens looked up were found cached" in met.evidence[1] and "7.5 MB" in met.evidence[1]
    )
    partly = diagnose_leftovers(0.040, 0.022, 0.5, 0.45, 1_000_000)
    assert partly.headline.startswith("Reuse helped (0.55x the cold TTFT)")
    none = diagnose_leftovers(0.040, 0.039, 0.9, 0.0, 0)
    assert none.headline.startswith("Reuse did not shorten the wait here (0.97x")
    assert any("hit rate" in f for f in none.fixes)


# -- the bottleneck is named past a stated margin; the same measurements get the same words ---------


def test_a_phase_is_the_bottleneck_only_from_60_percent():
    from lab.inspector import BOTTLENECK_SHARE

    assert BOTTLENECK_SHARE == 0.60
    wok = verdict_for(prefill_s=0.62, steps=38, step_s=0.01, forward_share=0.9)  # TTFT 62 % of E2E
    assert wok.slow_phase == "prefill" and "the wok is the bottleneck" in wok.headline
    pot = verdict_for(prefill_s=0.38, steps=62, step_s=0.01, forward_share=0.9)  # decode 62 %
    assert pot.slow_phase == "decode" and "the soup pot is the bottleneck" in pot.headline


def test_between_the_margins_the_order_is_balanced_and_says_why():
    v = verdict_for(prefill_s=0.52, steps=48, step_s=0.01, forward_share=0.9)  # TTFT 52 %, decode 48 %
    assert v.slow_phase == "balanced"
    assert v.headline.startswith("Balanced: the wok took 52% of the wait and the soup pot 48%")
    assert "neither reaches 60%" in v.headline
    assert any(f.startswith("Shorten the prompt") for f in v.fixes)  # both pots get advice


def test_a_balanced_order_still_names_the_pots_regime():
    # The More tables lesson's shape: the wok's 1,024 prompt tokens take about as long as 31 steps of
    # 64 tables' pot, whose 1.28 GFLOP over 40 MB (32 FLOP/byte) are right of the 5 FLOP/byte ridge.
    v = verdict_for(prefill_s=0.5, steps=31, step_s=0.015, forward_share=0.95, batch=64,
                    decode_flops=1.28e9, decode_bytes=40e6)  # fmt: skip
    assert v.slow_phase == "balanced" and v.decode_bound == "compute"
    assert v.headline.endswith("; the soup pot: compute-bound at batch 64: 32.0 FLOP/byte, right of the DRAM "
                               "ridge at 5.0 FLOP/byte; memory-bound below about batch 10")  # fmt: skip


def test_two_orders_that_measure_the_same_within_noise_get_the_same_diagnosis():
    # The same order twice: TTFT 52 % then 49 % of E2E; steps 15.8 then 15.6 ms, half outside forward().
    a = verdict_for(prefill_s=0.52, steps=30, step_s=0.0158, forward_share=0.50)
    b = verdict_for(prefill_s=0.49, steps=30, step_s=0.0156, forward_share=0.51)
    assert a.slow_phase == b.slow_phase == "balanced"
    assert a.decode_bound == b.decode_bound is None  # about half overhead: no flip between the two causes
    assert any("about half of each step is outside the forward pass" in e for e in a.evidence)


def test_the_headline_quotes_tpot_as_the_panels_print_it():
    from lab.units import fmt_s

    trace, out = build_trace(prefill_s=0.04, steps=63, step_s=0.0123, forward_share=0.9)
    m = compute_metrics(trace, out, kv_allocated=4096)
    v = diagnose(m, trace, ROOF)
    assert f"TPOT {fmt_s(m.tpot_s)}" in v.headline  # the panels' TPOT, not the median step
    assert any("decode step median" in e for e in v.evidence)  # the median, labelled as one


def test_an_order_that_reused_leftovers_says_how_many_tokens():
    trace, out = build_trace(prefill_s=0.01, steps=60, step_s=0.01, forward_share=0.9, prompt=448)
    m = compute_metrics(trace, out, kv_allocated=4096)
    v = diagnose(m, trace, ROOF, reused=447, prompt_tokens=448)
    assert "447 of 448 prompt tokens reused from leftovers (not cooked)" in v.headline
    fresh = diagnose(m, trace, ROOF)
    assert "reused" not in fresh.headline
