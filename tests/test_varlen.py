"""Packed prefill's attention as one masked call (engine/attention.py `packed_attention`): the same
numbers as the per-sequence loop on every family. The one-call way is for CUDA, so these tests
switch it on for the CPU; which way is faster is measured, not tested (docs/benchmarks/varlen-cpu.md)."""

import pytest
import torch

import engine.attention as attention_mod
from engine import Engine
from engine.attention import BatchKV
from engine.batching import build_batch
from lab import kitchens

FAMILIES = ["tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gpt2"]
PROMPTS = [[11, 57, 3, 200, 42, 9, 101, 7], [5, 6], [40, 41, 42, 43, 44]]


def test_document_mask_is_block_diagonal_and_causal():
    m = attention_mod.document_mask((3, 2), torch.device("cpu"))
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])
    assert torch.equal(m, expected.bool())


@pytest.mark.parametrize("family", FAMILIES)
def test_one_call_equals_the_loop(family, request, monkeypatch):
    eng = Engine.load(str(request.getfixturevalue(family).path))
    batch = build_batch(PROMPTS, "packed", "cpu", max_slots=16)
    with torch.inference_mode():
        loop = eng.model(batch.tokens, batch.positions, BatchKV(packed=batch.packed))
        monkeypatch.setattr(attention_mod, "ONE_CALL_DEVICES", ("cpu",))
        one = eng.model(batch.tokens, batch.positions, BatchKV(packed=batch.packed))
    torch.testing.assert_close(one, loop, atol=1e-5, rtol=0)
    padded = kitchens.generate(eng, PROMPTS, max_new_tokens=6, batching="padded").tokens
    assert eng.generate(PROMPTS, max_new_tokens=6).tokens == padded


def test_one_call_only_when_it_scores_no_more_pairs_than_padding(tiny_llama, monkeypatch):
    """Equal lengths: N^2 = B^2 L^2 > B L^2, so the loop runs (the mask is never built)."""
    monkeypatch.setattr(attention_mod, "ONE_CALL_DEVICES", ("cpu",))

    def no_mask(*args):
        raise AssertionError("one-call attention used where it would score more pairs than padding")

    monkeypatch.setattr(attention_mod, "document_mask", no_mask)
    eng = Engine.load(str(tiny_llama.path))
    res = eng.generate([[1, 2, 3, 4], [5, 6, 7, 8]], max_new_tokens=3)
    assert [len(t) for t in res.tokens] == [3, 3]
