"""serve-bench on the real engine: a small seeded Poisson run of every policy, and its refusals."""

from __future__ import annotations

import json
import random
import time

import pytest

from engine import Engine
from engine.bench import decode_step
from engine.bench.cli import main as cli
from engine.model import prefill
from engine.workload import Dist, make_requests, percentiles


def test_every_policy_serves_the_same_seeded_stream(tiny_llama, capsys):
    code = cli(["serve-bench", "--model", str(tiny_llama.path), "--policy", "all", "--rate", "200",
                "--requests", "12", "--prompt-len", "choice:4,4,40", "--output-len", "uniform:2:8",
                "--token-budget", "16", "--seed", "3", "--decode-step", "1,2", "--json"])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"static", "continuous", "chunked"}
    for rep in out["policies"].values():
        assert rep["requests"] == 12 and rep["requests_per_s"] > 0 and rep["tokens_per_s"] > 0
        for key in ("ttft_s", "tpot_s", "itl_s"):
            assert set(rep[key]) == {"p50", "p90", "p99"}
            assert 0 < rep[key]["p50"] <= rep[key]["p90"] <= rep[key]["p99"]
        assert rep["slo_met"] <= 12 and rep["goodput"] <= rep["requests_per_s"] + 1e-9
    ratios = out["ratios"]
    assert ratios["continuous_vs_static_requests_per_s"] == pytest.approx(
        out["policies"]["continuous"]["requests_per_s"] / out["policies"]["static"]["requests_per_s"]
    )
    assert "chunked_vs_continuous_itl_p99" in ratios
    assert [t["batch"] for t in out["decode_step"]] == [1, 2]
    assert all(t["fixed_ms"] > 0 and t["serving_ms"] > 0 and t["order_ms"] > 0 and t["aa_ratio"] > 0
               for t in out["decode_step"])  # fmt: skip


def test_a_stall_outside_the_decode_steps_stays_out_of_a_steps_time(tiny_llama, monkeypatch):
    """Each side times its own decode steps: a 200 ms stall in every other prefill (a busy neighbour
    taking the core) neither enters a step's time nor, subtracted, drives it to zero or below."""
    calls = []

    def stalling_prefill(*args, **kwargs):
        calls.append(1)
        if len(calls) % 2:
            time.sleep(0.2)
        return prefill(*args, **kwargs)

    monkeypatch.setattr(decode_step, "prefill", stalling_prefill)
    engine = Engine.load(str(tiny_llama.path), policy="static", max_seqs=2)
    t = decode_step.time_decode_step(engine, 2, new_tokens=8, repeats=3)
    assert len(calls) == 1 + 2 * 3  # the fixed path's prefills: the warm-up, then twice a round
    assert 0 < t.fixed_ms < 200 / 7 and 0 < t.fixed_again_ms < 200 / 7  # a stall inside would be >= 28.6 ms
    assert t.serving_ms > 0 and t.order_ms > 0
    assert t.forward == "op by op: the model's forward"  # the fixed path's forward, not the native step
    with pytest.raises(ValueError, match="at least 2 new tokens"):
        decode_step.time_decode_step(engine, 2, new_tokens=1)


def test_the_request_list_is_seeded_and_poisson():
    a = make_requests(2000, 50.0, Dist.parse("uniform:4:9", "p"), Dist.parse("8", "o"), 7, 100)
    b = make_requests(2000, 50.0, Dist.parse("uniform:4:9", "p"), Dist.parse("8", "o"), 7, 100)
    assert a == b
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 50, rel=0.1)  # mean gap 1 / rate
    assert {len(r.prompt) for r in a} == set(range(4, 10)) and all(r.max_new_tokens == 8 for r in a)
    assert Dist.parse("choice:3,5", "x").draw(random.Random(0)) in (3, 5)
    assert percentiles([1.0, 2.0, 3.0, 4.0])["p50"] == pytest.approx(2.5)


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--policy", "fifo"], "--policy 'fifo' is not one of static, continuous, chunked, all, none"),
        (["--rate", "0"], "--rate must be > 0"),
        (["--requests", "0"], "--requests must be between 1 and 100,000"),
        (["--prompt-len", "uniform:9:3"], "--prompt-len 'uniform:9:3' is not a length"),
        (["--output-len", "lots"], "--output-len 'lots' is not a length"),
        (["--prompt-len", "120", "--output-len", "20"], "exceeds a KV seat of 128 tokens"),
        (["--decode-step", "1,x"], "--decode-step must be comma-separated batch sizes"),
        (["--decode-step", "0"], "--decode-step batch sizes must be between 1 and --max-seqs 64"),
        (["--decode-step", "1", "--decode-repeats", "0"], "--decode-repeats must be between 1 and 100 (got 0)"),
        (["--token-budget", "0"], "token_budget must be at least 1"),
        (["--rate"], "expected one argument"),
        (["--slo-ttft", "-1"], "--slo-ttft and --slo-tpot must be > 0"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tiny_llama, capsys, args, pattern):
    assert cli(["serve-bench", "--model", str(tiny_llama.path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert pattern in err and "\n" not in err and "Traceback" not in err


def test_kv_layout_probe_times_both_layouts_on_the_same_data():
    from engine.bench.kv_layout import KVShape, time_layouts

    t = time_layouts(KVShape("tiny", 2, 4, 2, 8), batch=3, context=32, repeats=2)
    assert t.seats_ms > 0 and t.blocks_ms > 0 and t.blocks_vs_seats == t.blocks_ms / t.seats_ms


def test_prefix_reuse_probe_times_cold_and_warm_on_the_real_engine(tiny_llama):
    from engine import Engine
    from engine.bench.prefix_reuse import time_reuse

    t = time_reuse(Engine.load(str(tiny_llama.path)), prompt_len=60, shared=0.9, repeats=2)
    assert t.shared_tokens == 54 and t.warm_cached_tokens == 54
    assert t.cold_ttft_s > 0 and t.warm_ttft_s > 0 and t.ratio == t.warm_ttft_s / t.cold_ttft_s


def test_speculation_probe_compares_plain_and_drafted_decode_on_the_real_engine(tiny_llama):
    from engine import Engine
    from engine.bench.speculation import time_speculation

    eng = Engine.load(str(tiny_llama.path))
    t = time_speculation(eng, [5, 6, 7, 5, 6, 7, 5, 6], "copy", k=3, new=16, repeats=2)
    assert t.identical and t.plain_tps > 0 and t.spec_tps > 0 and t.mean_acceptance_length >= 1
    assert t.speedup == t.spec_tps / t.plain_tps
