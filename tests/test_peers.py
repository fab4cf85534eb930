"""The peer bench's own logic, without llama.cpp: the report's arithmetic, its page, and the one-line
refusal when no llama.cpp build is there. (Running llama.cpp itself is the bench's job, not CI's.)"""

import time

import pytest

from engine.bench.cli import main
from engine.bench.peer_llama import EXTRA_PRE, find_build
from engine.bench.peers import MODELS, TARGETS, check_targets, matching_prefix, our_source, ratios, summary
from engine.bench.peers_page import page
from engine.bench.wait_policy import Neighbour
from engine.errors import EngineError

MEDIANS = {
    "llama.cpp f32": {"decode_tps": 700.0, "prefill_tps": 7000.0, "batch_decode_tps": 2000.0},
    "llama.cpp q8_0": {"decode_tps": 800.0, "prefill_tps": 5000.0, "batch_decode_tps": 2500.0},
    "ours fp32 default": {"decode_tps": 350.0, "prefill_tps": 6000.0, "batch_decode_tps": 4400.0},
    "ours fp32 compiled": {"decode_tps": 840.0, "prefill_tps": 8400.0},
    "ours int8 default": {"decode_tps": 400.0, "prefill_tps": 6500.0, "batch_decode_tps": 3000.0},
}


def test_ratios_pair_each_of_ours_with_its_llama_cpp_counterpart():
    r = ratios(MEDIANS)
    assert r["decode_fp32_default_vs_f32"] == pytest.approx(0.5)
    assert r["decode_fp32_best_vs_f32"] == pytest.approx(1.2)  # the best fp32 configuration: compiled
    assert r["prefill_fp32_best_vs_f32"] == pytest.approx(1.2)
    assert r["decode_int8_default_vs_q8_0"] == pytest.approx(0.5)
    assert r["batch_decode_fp32_vs_f32"] == pytest.approx(2.2)
    assert r["prefill_int8_best_vs_q8_0"] == pytest.approx(1.3)
    t = check_targets(r)
    assert set(t) <= set(TARGETS)
    assert t["decode_fp32_default_vs_f32"] == {"ratio": pytest.approx(0.5), "target": 1.0, "met": False}
    assert t["batch_decode_fp32_vs_f32"]["met"] and t["decode_fp32_best_vs_f32"]["met"]
    assert "decode_fp32_best_vs_f32" not in ratios({"ours fp32 default": {"decode_tps": 1.0}})  # no peer, no ratio


def test_summary_and_agreement():
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "samples": [3.0, 1.0, 2.0]}
    assert matching_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert matching_prefix([1, 2], [1, 2, 3]) == 2


def test_page_has_a_row_per_contestant_and_the_targets():
    results = {n: {k: summary([v, v * 0.9, v * 1.1]) for k, v in m.items()} for n, m in MEDIANS.items()}
    r = ratios(MEDIANS)
    report = {
        "plan": {"threads": 2, "rounds": 3, "decode_new": 128, "decode_prompt": 128, "prefill": 512, "batch": 32,
                 "batch_new": 32, "batch_prompt": 32},
        "timestamp_utc": "2026-12-01T00:00:00Z", "machine": {"cpu": "a CPU", "cpu_count": 2},
        "load_average": {"min": 1.5, "max": 2.5}, "llama_cpp": "version: 1 (abc)",
        "models": {"chef": {"plan": {"prefill": 511}, "results": results, "greedy_tokens_matching_hf": {"llama.cpp f32": 32}, "greedy_of": 32,
                            "kernel_ceilings_tps": {}, "ratios": r, "targets": check_targets(r),
                            "ceiling_ratios": {}}},
    }  # fmt: skip
    text = page(report)
    assert "| llama.cpp f32 | 700.0 (630.0-770.0) |" in text and "| 32/32 |" in text
    assert "Ours loads the files" not in text  # the chef: its folder
    report["models"]["chef"]["ours_loads"] = {"fp32": "/w/a-f32.gguf", "int8": "/w/a-q8_0.gguf"}
    assert "Ours loads the files llama.cpp runs: fp32 from `a-f32.gguf`, int8 from `a-q8_0.gguf`." in page(report)
    assert "| decode fp32 default vs f32 | 0.50 | 1.0 | no |" in text


def test_the_assistant_is_timed_on_the_same_gguf_files_on_both_sides():
    """Ours int8 loads the q8_0 file llama.cpp's q8_0 runs, ours fp32 the f32 file; the other models their folder."""
    prep = {"folder": "/m/hf", "gguf": {"f32": "/m/assistant-f32.gguf", "q8_0": "/m/assistant-q8_0.gguf"}}
    assert MODELS["assistant"] == "assistant"
    assert our_source("assistant", prep, "int8") == "/m/assistant-q8_0.gguf"
    assert our_source("assistant", prep, None) == "/m/assistant-f32.gguf"
    assert our_source("chef", prep, "int8") == our_source("chef", prep, None) == "/m/hf"


def test_no_llama_cpp_build_is_one_line(tmp_path, capsys):
    with pytest.raises(EngineError, match="llama.cpp not found under .*build_llama_cpp.sh"):
        find_build(tmp_path)
    assert main(["peers", "--llama-cpp", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "llama.cpp not found" in err[0] and "nowhere" in err[0]
    assert main(["peers", "--models", "gpt-5"]) == 2
    assert "unknown model 'gpt-5'" in capsys.readouterr().err


def test_the_chefs_pre_tokenizer_is_mapped_to_gpt2():
    assert EXTRA_PRE["593bb4df7d3bea0b0a6b54667111959fc8e66deaa178928a480a2b140e202d13"] == "gpt-2"


def test_the_neighbour_counts_its_loops_in_a_window():
    with Neighbour() as nb:
        time.sleep(0.5)
    t0, t1 = nb.marks[0][0], nb.marks[-1][0]
    assert nb.rate(t0, t1) > 0 and nb.rate(t1 + 1, t1 + 2) == 0.0
