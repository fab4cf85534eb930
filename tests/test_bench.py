"""The benchmark's report: complete, positive, and every ratio recomputable from its own parts.

Runs the real engine and real HF `generate` on a tiny random Llama (conftest's `tiny_llama_tied`),
with a handful of tokens. No speed assertions: the machine is shared; speed lives in the report.
"""

import importlib
import json
import math

import pytest
import torch

from engine.bench.bench import run_bench
from engine.bench.ceilings import matmul_chain
from engine.bench.cli import main, parse_args, plan_from
from engine.bench.contestants import load_contestants, random_prompts, run_hf, run_ours
from engine.bench.plan import QUICK, BenchPlan
from engine.bench.report import check_targets, derive_ratios, kernel_bounds, roofline_bounds
from engine.bench.roofline import Roofline, measure_roofline
from engine.costs import step_cost
from engine.loader import read_config

REQUIRED_RATIOS = [
    "decode_tpot_vs_hf_b1",
    "decode_bw_fraction",
    "prefill_flops_fraction",
    "ttft_vs_hf",
    "decode_tps_vs_hf_b32",
]
TINY = BenchPlan(
    prefill_tokens=24,
    decode_prompt_tokens=5,
    decode_tokens=4,
    big_batch=3,
    big_batch_prompt_tokens=4,
    repeats=2,
    warmup=1,
)


@pytest.fixture(scope="module")
def small_roof() -> Roofline:
    return measure_roofline("cpu", "float32", quick=True, buffer_bytes=8 * 2**20, gemm_sizes=(128,))


@pytest.fixture(scope="module")
def report(tiny_llama_tied, small_roof) -> dict:
    lines = []
    r = run_bench(str(tiny_llama_tied.path), plan=TINY, progress=lines.append, roofline=small_roof)
    r["_progress"] = lines
    return r


def test_report_has_every_section_and_the_required_ratios(report):
    for key in ("roofline", "prefill", "decode_b1", "decode_b3", "ratios", "targets", "machine", "plan"):
        assert key in report
    for name in REQUIRED_RATIOS:
        value = report["ratios"][name]
        assert value > 0 and math.isfinite(value), name
        assert report["targets"][name]["met"] in (True, False)
    assert report["plan"]["repeats"] == TINY.repeats
    assert report["_progress"], "progress lines were reported"
    json.dumps({k: v for k, v in report.items() if k != "_progress"})  # JSON-ready


def test_every_timing_has_one_positive_sample_per_repeat(report):
    timed = [
        report["prefill"]["hf"]["ttft_s"],
        report["prefill"]["ours"]["ttft_s"],
        report["prefill"]["ours"]["prefill_s"],
        report["decode_b1"]["hf"]["tpot_s"],
        report["decode_b1"]["ours"]["tpot_s"],
        report["decode_b3"]["ours"]["decode_tps"],
    ]
    for t in timed:
        assert len(t["samples"]) == TINY.repeats
        assert all(v > 0 for v in t["samples"])
        assert min(t["samples"]) <= t["median"] <= max(t["samples"])
    # prefill's forward pass is part of TTFT, never more than it
    assert report["prefill"]["ours"]["prefill_s"]["median"] <= report["prefill"]["ours"]["ttft_s"]["median"]


def test_both_sides_time_each_step_of_one_run_on_the_callers_clock(tiny_llama_tied):
    """TPOT comes from one run's token times (never a difference of two runs, which noise can make
    negative): n increasing times per run, the first being TTFT, all inside the run's wall time."""
    c = load_contestants(str(tiny_llama_tied.path), "cpu", "float32", str(tiny_llama_tied.path))
    prompts = random_prompts(c.vocab_size, 2, 5, seed=2)
    cpu = torch.device("cpu")
    for run in (run_hf(c.hf, prompts, 4, cpu), run_ours(c.engine, prompts, 4, cpu)):
        assert len(run.token_times) == 4 and len(run.tokens) == 2 and all(len(t) == 4 for t in run.tokens)
        assert 0 < run.ttft_s and all(a < b for a, b in zip(run.token_times, run.token_times[1:], strict=False))
        assert run.token_times[-1] <= run.wall_s
        assert run.tpot_s == pytest.approx((run.token_times[3] - run.token_times[0]) / 3)
    assert run.result.tokens == run.tokens
    with pytest.raises(ValueError, match="at least 2 tokens"):
        _ = run_ours(c.engine, prompts, 1, cpu).tpot_s


def test_ratios_follow_from_the_measured_parts(report, small_roof):
    pre, b1, b3 = report["prefill"], report["decode_b1"], report["decode_b3"]
    again = derive_ratios(small_roof, pre, b1, b3)
    assert again == report["ratios"]
    r = report["ratios"]
    assert r["ttft_vs_hf"] == pytest.approx(pre["ours"]["ttft_s"]["median"] / pre["hf"]["ttft_s"]["median"])
    assert r["decode_tpot_vs_hf_b1"] == pytest.approx(
        b1["ours"]["tpot_s"]["median"] / b1["hf"]["tpot_s"]["median"]
    )
    bytes_per_step = b1["ours"]["weight_bytes_per_step"] + b1["ours"]["kv_bytes_read_per_step"]
    achieved = bytes_per_step / b1["ours"]["tpot_s"]["median"]
    assert r["decode_bw_fraction"] == pytest.approx(achieved / small_roof.bandwidth_bytes_per_s)
    # HF's tokens/s at batch B is B sequences / its TPOT
    assert b3["hf"]["decode_tps"] == pytest.approx(3 / b3["hf"]["tpot_s"]["median"])
    assert r["decode_tps_vs_hf_b32"] == pytest.approx(
        b3["ours"]["decode_tps"]["median"] / b3["hf"]["decode_tps"]
    )


def test_roofline_bounds_follow_from_the_roofs_and_hf_times(report, small_roof):
    """Each bound = (the roofline floor of our time) / HF's time; the report carries them."""
    pre, b1, b3 = report["prefill"], report["decode_b1"], report["decode_b3"]
    bounds = roofline_bounds(small_roof, pre, b1, b3, 4)
    assert bounds == report["ratio_bounds"]
    bw, flops = small_roof.bandwidth_bytes_per_s, small_roof.flops_per_s
    read1 = b1["ours"]["weight_bytes_per_step"] + b1["ours"]["kv_bytes_read_per_step"]
    floor1 = max(read1 / bw, 2 * b1["ours"]["weight_bytes_per_step"] / 4 / flops)
    assert bounds["decode_tpot_vs_hf_b1"] == pytest.approx(floor1 / b1["hf"]["tpot_s"]["median"])
    assert bounds["ttft_vs_hf"] == pytest.approx(
        pre["ours"]["prefill_flops"] / flops / pre["hf"]["ttft_s"]["median"]
    )
    # no measured ratio can beat its bound unless a roof was under-measured
    for name in ("decode_tpot_vs_hf_b1", "ttft_vs_hf"):
        assert report["targets"][name]["bound"] == bounds[name]


def test_a_target_beyond_the_roofline_says_so():
    """Hand-made numbers: our floor 22 ms vs HF 40 ms -> bound 0.55, so a 0.5 target needs 110 %."""
    targets = check_targets({"decode_tpot_vs_hf_b1": 0.7}, {"decode_tpot_vs_hf_b1": 0.55})
    t = targets["decode_tpot_vs_hf_b1"]
    assert t["met"] is False
    assert t["roof_share_needed"] == pytest.approx(0.55 / 0.5)  # over 1: out of reach at these roofs
    tps = check_targets({"decode_tps_vs_hf_b32": 1.2}, {"decode_tps_vs_hf_b32": 3.0})["decode_tps_vs_hf_b32"]
    assert tps["roof_share_needed"] == pytest.approx(1.5 / 3.0)


def test_kernel_ceilings_are_measured_and_bound_the_ratios(report, small_roof):
    """The kernel-only chains are timed, the bounds follow from them, and our real decode step,
    which runs the native step's products plus everything else, is slower than those products
    alone. (Torch's GEMMs alone bound the forward op by op, not the native step: on this tiny model
    their dispatch alone can exceed the whole native step.)"""
    ceil = report["kernel_ceilings"]
    assert ceil["prefill_gemm_s"] > 0 and ceil["prefill_attention_s"] > 0
    assert ceil["prefill_s"] == pytest.approx(ceil["prefill_gemm_s"] + ceil["prefill_attention_s"])
    assert set(ceil["decode_step_s"]) == {"b1", "b3"} and min(ceil["decode_step_s"].values()) > 0
    pre, b1, b3 = report["prefill"], report["decode_b1"], report["decode_b3"]
    assert kernel_bounds(ceil, small_roof, pre, b1, b3) == report["ratio_kernel_bounds"]
    assert report["ratio_kernel_bounds"]["decode_tpot_vs_hf_b1"] == pytest.approx(
        ceil["decode_step_s"]["b1"] / b1["hf"]["tpot_s"]["median"]
    )
    assert set(ceil["native_decode_step_s"]) == {"b1", "b3"}  # the engine's default runs the native step
    assert ceil["native_decode_step_s"]["b1"] < b1["ours"]["tpot_s"]["median"]
    t = report["targets"]["decode_tpot_vs_hf_b1"]
    assert t["kernel_share_needed"] == pytest.approx(t["kernel_bound"] / 0.5)


def test_the_kernel_chain_multiplies_every_weight_once(tiny_llama_tied):
    """One `mm` per layer weight (qkv, out, gate_up, down) plus the LM head: the engine's GEMMs."""
    from torch.profiler import ProfilerActivity, profile

    from engine import Engine

    model = Engine.load(str(tiny_llama_tied.path)).model
    run = matmul_chain(model, rows=2, head_rows=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    mm = sum(e.count for e in prof.key_averages() if e.key == "aten::mm")
    assert mm == 4 * model.cfg.n_layers + 1


def test_a_target_beyond_the_kernels_says_so():
    """Hand-made: GEMMs alone give 0.6 of HF's TPOT, so a 0.5 target needs 120 % of their speed."""
    t = check_targets({"decode_tpot_vs_hf_b1": 0.8}, None, {"decode_tpot_vs_hf_b1": 0.6})
    assert t["decode_tpot_vs_hf_b1"]["kernel_share_needed"] == pytest.approx(1.2)
    assert "bound" not in t["decode_tpot_vs_hf_b1"]


def test_byte_and_flop_counts_match_the_model_shape(report, tiny_llama_tied):
    cfg = read_config(tiny_llama_tied.path)
    info = report["model_info"]
    b1 = report["decode_b1"]["ours"]
    # tied model: every stored weight is read once per decode step
    assert b1["weight_bytes_per_step"] == info["weight_bytes"] == cfg.num_params() * 4
    # decode steps 1..n-1 attend to prompt + step positions: mean (5+1 + 5+3) / 2 = 7 tokens
    assert b1["kv_bytes_read_per_step"] == pytest.approx(7 * cfg.kv_bytes_per_token(4))
    t = TINY.prefill_tokens  # causal prefill: token i attends to i + 1 keys, t (t + 1) / 2 pairs
    expected = step_cost(cfg, 1, t, t, 4, logits_rows=1, attn_pairs=t * (t + 1) // 2).flops
    assert report["prefill"]["ours"]["prefill_flops"] == pytest.approx(expected)


def test_same_weights_give_the_same_greedy_tokens(report):
    """The proof both sides run identical tensors: fp32 greedy decoding agrees token for token."""
    assert report["decode_b1"]["greedy_tokens_matching_hf"] == TINY.decode_tokens
    assert report["decode_b3"]["greedy_tokens_matching_hf"] == TINY.decode_tokens


def test_cli_writes_json_with_ratios(tiny_llama_tied, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(tiny_llama_tied.path), "--quick", "--json", "--quiet", "--out", str(out)]
    argv += ["--prefill-tokens", "16", "--decode-tokens", "3", "--batch", "2", "--repeats", "1"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed["ratios"] == saved["ratios"]
    assert set(REQUIRED_RATIOS) <= set(saved["ratios"])
    assert saved["quick"] is True and saved["plan"]["big_batch"] == 2
    roof = saved["roofline"]
    # measured three times; the roofs are the best of each
    assert roof["bandwidth_bytes_per_s"] == max(roof["details"]["bandwidths_bytes_per_s"]) > 0
    assert roof["flops_per_s"] == max(roof["details"]["flops_per_s"]) > 0
    assert len(roof["details"]["measurements"]) == 3


def test_text_report_names_every_ratio(tiny_llama_tied, capsys):
    argv = ["--model", str(tiny_llama_tied.path), "--quick", "--quiet", "--prefill-tokens", "8"]
    argv += ["--decode-tokens", "2", "--batch", "2", "--repeats", "1"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for name in REQUIRED_RATIOS:
        assert name in text
    assert "roofline: read" in text


@pytest.mark.parametrize(
    ("bench", "argv"),
    [
        ("engine.bench.cli", ["--repeats", "abc"]),
        ("engine.bench.peers", ["--rounds", "abc"]),
        ("engine.bench.wait_policy", ["--rounds", "abc"]),
        ("engine.bench.step_profile", ["--steps", "abc"]),
    ],
)
def test_a_malformed_option_is_one_line_too(bench, argv, capsys):
    """Every bench parses with the one-line parser (engine/errors.py) and refuses with exit 2."""
    assert importlib.import_module(bench).main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "invalid int value: 'abc'" in err and "\n" not in err


def test_a_negative_operator_count_is_refused_in_one_line(capsys):
    from engine.bench import step_profile

    assert step_profile.main(["--ops", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --ops must be 0 or more (got -1)"


def test_quick_flag_picks_the_quick_plan():
    assert plan_from(parse_args(["--quick"])) == QUICK
    assert plan_from(parse_args(["--quick", "--repeats", "7"])).repeats == 7


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--decode-tokens", "1"], "decode tokens must be at least 2"),
        (["--repeats", "0"], "repeats must be at least 1"),
        (["--model", "no-such-model-anywhere"], "not found"),
        (["--dtype", "float8"], "invalid dtype 'float8'"),
        (["--threads", "0"], "threads must be between 1 and"),
        (["--out", "/no/such/folder/r.json"], "cannot write the report"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(extra, words, capsys):
    assert main(["--quick", "--quiet", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def test_profile_lists_the_decode_step_ops(tiny_llama_tied, small_roof):
    plan = BenchPlan(8, decode_prompt_tokens=4, decode_tokens=2, big_batch=2, big_batch_prompt_tokens=2, repeats=1)
    threads_before = torch.get_num_threads()
    r = run_bench(str(tiny_llama_tied.path), plan=plan, roofline=small_roof, threads=1, profile_steps=3)
    assert r["machine"]["torch_threads"] == 1  # measured with the threads asked for...
    assert torch.get_num_threads() == threads_before  # ...and the caller's setting is restored
    assert set(r["decode_profile"]) == {"b1", "b2"}
    for batch, prof in ((1, r["decode_profile"]["b1"]), (2, r["decode_profile"]["b2"])):
        assert prof["steps"] == 3 and prof["batch"] == batch and prof["ms_per_step_total"] > 0
        ops = {row["op"]: row for row in prof["top_ops"]}
        # every decode step multiplies by 4 weight matrices per layer (2 layers) plus the LM head
        assert ops["aten::mm"]["calls_per_step"] == 4 * 2 + 1
        assert sum(row["share"] for row in prof["top_ops"]) <= 1.0 + 1e-9


def test_the_whole_bench_can_judge_the_compiled_engine(tiny_llama_tied, small_roof):
    """--engine-compile: ours is loaded compile=True, its decode steps really run compiled (the report
    counts them), and fp32 greedy tokens still equal HF's."""
    plan = BenchPlan(8, decode_prompt_tokens=4, decode_tokens=3, big_batch=2, big_batch_prompt_tokens=2, repeats=1,
                compile=True)  # fmt: skip
    r = run_bench(str(tiny_llama_tied.path), plan=plan, roofline=small_roof, threads=1)
    assert r["plan"]["compile"] is True and r["compiled_decode"]["failure"] is None
    assert r["compiled_decode"]["steps"] > 0
    assert r["decode_b1"]["greedy_tokens_matching_hf"] == 3 and r["decode_b2"]["greedy_tokens_matching_hf"] == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bench_times_the_graphed_decode_too(tiny_llama_tied):
    r = run_bench(str(tiny_llama_tied.path), device="cuda", dtype="float32", plan=TINY)
    graph = r["decode_b1"]["ours_cuda_graph"]
    assert len(graph["tpot_s"]["samples"]) == TINY.repeats and graph["tpot_s"]["median"] > 0
    assert r["ratios"]["decode_tpot_cuda_graph_vs_hf_b1"] > 0
    assert r["decode_b1"]["greedy_tokens_matching_hf"] == TINY.decode_tokens


def test_gpu_goals_apply_to_their_shapes_on_cuda_only():
    from engine.bench.report import gpu_goal_ratios

    b1 = {"ours_cuda_graph": {"tpot_s": {"median": 1.5e-3}}}
    ratios = {"prefill_flops_fraction": 0.52}
    got = gpu_goal_ratios("preset:llama-3.2-1b", "cuda", ratios, b1)
    assert got == pytest.approx({"decode_tpot_cuda_graph_vs_goal_b1": 1.25, "prefill_flops_fraction_vs_gpu_goal": 0.8})
    verdicts = check_targets(got)
    assert not verdicts["decode_tpot_cuda_graph_vs_goal_b1"]["met"]
    assert not verdicts["prefill_flops_fraction_vs_gpu_goal"]["met"]
    assert gpu_goal_ratios("preset:smollm2-135m", "cuda", ratios, b1) == {"decode_tpot_cuda_graph_vs_goal_b1": 1.5}
    assert gpu_goal_ratios("preset:llama-3.2-1b", "cpu", ratios, b1) == {}
    assert gpu_goal_ratios("chef", "cuda", ratios, b1) == {}  # no goal for the chef's shape
