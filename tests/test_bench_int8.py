"""The smaller-portions benchmark (engine/bench/int8.py, `python -m engine bench --quant int8`): it runs,
reports every contestant and ratio, and refuses a bad --quant in one line. No timing is asserted."""

import json

import pytest
import torch

from engine import Engine
from engine.bench.ceilings import matmul_chain
from engine.bench.cli import main as cli_main
from engine.bench.int8 import COMPILED, VARIANTS, QuantPlan, run
from engine.compiled import compiler_problem

TINY = QuantPlan(decode_prompt_tokens=4, decode_tokens=3, prefill_tokens=8, repeats=1, agreement_tokens=6)


def test_report_has_every_contestant_and_ratio(tiny_llama):
    report = run((str(tiny_llama.path),), TINY)
    (m,) = report["models"]
    assert set(m["tpot_s"]) == set(m["prefill_s"]) == {*VARIANTS, "hf"}
    assert all(m["tpot_s"][v]["median"] > 0 for v in (*VARIANTS, "hf"))
    assert m["weight_bytes"]["int8"] < m["weight_bytes"]["float32"]
    assert m["kernel_b1_s"]["int8"] > 0 and m["kernel_b1_s"]["float32"] > 0
    assert m["greedy_agreement"]["tokens"] == 6 and 0 <= m["greedy_agreement"]["common_prefix"] <= 6
    assert m["ratios"]["int8_tpot_vs_fp32"] == m["tpot_s"]["int8"]["median"] / m["tpot_s"]["float32"]["median"]
    assert report["targets"] == {"int8_tpot_vs_fp32": 0.6, "int8_tpot_vs_hf_fp32": 0.5}
    assert m["compiled"] == {}  # no compile=True engines unless asked


def test_cli_writes_the_report_and_refuses_a_bad_quant(tiny_llama, tmp_path, capsys):
    out = tmp_path / "int8.json"
    code = cli_main(["bench", "--quant", "int8", "--model", str(tiny_llama.path), "--repeats", "1",
                     "--decode-tokens", "2", "--prefill-tokens", "8", "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0 and json.loads(out.read_text())["models"][0]["model"] == str(tiny_llama.path)
    capsys.readouterr()
    assert cli_main(["bench", "--quant", "int4", "--quiet"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_kernel_chain_runs_int8_weights_through_their_kernels(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), quant="int8")
    matmul_chain(eng.model, rows=1, head_rows=1)()  # Int8Weight modules, not tensors: no error
    matmul_chain(eng.model, rows=16, head_rows=1)()


@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_quant_with_compile_times_the_compiled_engines_too(tiny_llama, tmp_path):
    """`bench --quant int8 --compile`: float32 and int8 with compile=True join the rotation, really
    decode compiled, and give their eager twins' greedy tokens."""
    out = tmp_path / "int8c.json"
    code = cli_main(["bench", "--quant", "int8", "--compile", "--model", str(tiny_llama.path), "--repeats", "1",
                     "--decode-tokens", "3", "--prefill-tokens", "8", "--out", str(out), "--quiet"])  # fmt: skip
    (m,) = json.loads(out.read_text())["models"]
    assert code == 0 and set(m["tpot_s"]) == {*VARIANTS, *COMPILED, "hf"}
    for v in COMPILED:
        c = m["compiled"][v]
        assert c["failure"] is None and c["steps"] > 0
        assert c["agreement_with_eager"]["common_prefix"] == c["agreement_with_eager"]["tokens"] > 0
    assert m["ratios"]["int8_compiled_tpot_vs_fp32_compiled"] > 0

