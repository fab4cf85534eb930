"""The fidelity measures (engine/fidelity.py) and how engine/bench/int8_quality.py reads llama.cpp's.

No model and no llama.cpp here: the arithmetic against the module's worked example and a hand
computation, llama-perplexity's summary as it prints it, and its base file's token ids."""

import math
import struct

import pytest
import torch

from engine.bench.int8_quality import agreement, answer, base_tokens, parse_kld
from engine.errors import EngineError
from engine.fidelity import FidelityMeter, prefix_agreement, scored_rows


def test_the_worked_example():
    """p = (0.7, 0.2, 0.1) against q = (0.6, 0.3, 0.1), the next token being token 1."""
    p, q = torch.tensor([[0.7, 0.2, 0.1]]).log(), torch.tensor([[0.6, 0.3, 0.1]]).log()
    meter = FidelityMeter()
    meter.add(p, q, torch.tensor([1]))
    f = meter.result()
    want = 0.7 * math.log(0.7 / 0.6) + 0.2 * math.log(0.2 / 0.3)
    assert f.positions == 1 and f.kl_mean == pytest.approx(want, rel=1e-6) and round(f.kl_mean, 3) == 0.027
    assert f.top1 == 1.0
    assert f.ppl == pytest.approx(1 / 0.3) and f.ppl_ref == pytest.approx(1 / 0.2)
    assert f.ppl_ratio == pytest.approx(0.2 / 0.3)


def test_positions_add_up_across_chunks_as_one_text():
    g = torch.Generator().manual_seed(0)
    ref, other, targets = torch.randn(10, 7, generator=g), torch.randn(10, 7, generator=g), torch.randint(0, 7, (10,), generator=g)
    whole, parts = FidelityMeter(), FidelityMeter()
    whole.add(ref, other, targets)
    parts.add(ref[:4], other[:4], targets[:4])
    parts.add(ref[4:], other[4:], targets[4:])
    a, b = whole.result(), parts.result()
    assert a.positions == b.positions == 10
    for name in ("kl_mean", "kl_median", "kl_p99", "kl_max", "top1", "ppl", "ppl_ref"):
        assert getattr(a, name) == pytest.approx(getattr(b, name)), name
    assert whole.result().kl_max >= whole.result().kl_p99 >= whole.result().kl_median >= 0


def test_llama_cpps_rule_scores_the_second_half_of_a_window():
    assert scored_rows(8) == [4, 5, 6]  # positions 4..6 predict tokens 5..7
    assert len(scored_rows(512)) == 255  # as llama-perplexity counts: n_ctx - 1 - n_ctx / 2


def test_greedy_agreement_counts_the_reference_answer_up_to_its_end():
    assert answer([5, 6, 2, 9, 9], eos=(2,)) == [5, 6, 2] and answer([5, 6, 7], eos=(2,)) == [5, 6, 7]
    assert prefix_agreement([5, 6, 2], [5, 6, 2, 8]) == 3 and prefix_agreement([5, 6, 2], [5, 7]) == 1
    got = agreement([[5, 6, 2], [1, 2]], [[5, 6, 2, 4], [3]])
    assert got == {"per_question": [3, 0], "answer_tokens": [3, 2], "shared": 3, "of": 5}


KLD_OUTPUT = """
====== Perplexity statistics ======
Mean PPL(Q)                   :  40.622188 ±   1.236270
Mean PPL(base)                :  40.451432 ±   1.231131
Cor(ln(PPL(Q)), ln(PPL(base))):  99.93%
Mean ln(PPL(Q)/PPL(base))     :   0.004213 ±   0.001018
Mean PPL(Q)/PPL(base)         :   1.004221 ±   0.001022
Mean PPL(Q)-PPL(base)         :   0.170756 ±   0.041582

====== KL divergence statistics ======
Mean    KLD:   0.003120 ±   0.000064
Maximum KLD:   0.039735
99.9%   KLD:   0.029342
99.0%   KLD:   0.013316
95.0%   KLD:   0.008905
Median  KLD:   0.002322
Minimum KLD:   0.000004

====== Token probability statistics ======
Same top p: 97.059 ± 0.374 %
"""


def test_llama_perplexitys_summary_is_read_into_the_same_figures():
    got = parse_kld(KLD_OUTPUT)
    assert got == {"ppl": 40.622188, "ppl_ref": 40.451432, "ppl_ratio": 1.004221, "kl_mean": 0.00312,
                   "kl_max": 0.039735, "kl_p99": 0.013316, "kl_median": 0.002322, "top1": pytest.approx(0.97059)}  # fmt: skip
    with pytest.raises(EngineError, match="llama-perplexity printed no kl_max, kl_mean"):
        parse_kld("\n".join(ln for ln in KLD_OUTPUT.splitlines() if "KLD" not in ln or "%" in ln))


def test_the_base_files_token_ids_are_the_windows_it_evaluated(tmp_path):
    path = tmp_path / "base.kld"
    tokens = list(range(100, 112))
    path.write_bytes(b"_logits_" + struct.pack("<Iii", 4, 50, 3) + struct.pack("<12i", *tokens) + b"\0" * 64)
    assert base_tokens(path) == (4, [tokens[0:4], tokens[4:8], tokens[8:12]])
    (tmp_path / "other").write_bytes(b"not logits" * 4)
    with pytest.raises(EngineError, match="is not a llama-perplexity base file"):
        base_tokens(tmp_path / "other")
