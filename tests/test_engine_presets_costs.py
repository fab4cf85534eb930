"""Presets (real shapes, random weights) and the analytic cost model."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from engine import Engine
from engine.costs import step_cost, weight_bytes
from engine.presets import PRESETS, bytes_needed, chef_codec, fill_random, preset_config


@pytest.mark.parametrize(
    "name, layers, params",
    [
        ("smollm2-135m", 30, 134_515_008),
        ("qwen2.5-0.5b", 24, 494_032_768),
        ("llama-3.2-1b", 16, 1_235_814_400),
    ],
)
def test_preset_shapes_match_the_published_models(name, layers, params):
    cfg = preset_config(name)
    assert cfg.n_layers == layers and cfg.tied
    assert cfg.num_params() == params
    assert bytes_needed(name, torch.bfloat16) > params * 2  # weights + RoPE tables
    assert preset_config("qwen2.5-0.5b").qkv_bias and not preset_config("smollm2-135m").qkv_bias


def test_num_params_counts_like_transformers(tiny_llama, tiny_gpt2):
    for tiny in (tiny_llama, tiny_gpt2):
        eng = Engine.load(str(tiny.path))
        assert eng.cfg.num_params() == sum(p.numel() for p in tiny.hf().parameters())


def test_random_fill_is_seeded(tiny_llama):
    a, b = Engine.load(str(tiny_llama.path)).model, Engine.load(str(tiny_llama.path)).model
    fill_random(a)
    fill_random(b)
    assert all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers(), strict=True))
    norms = [buf for name, buf in a.named_buffers() if name.endswith("norm.weight")]
    assert all(bool((n == 1).all()) for n in norms)
    assert 0.015 < float(a.lm_head_t.std()) < 0.025


def test_smollm2_preset_generates_and_says_it_is_untrained():
    eng = Engine.load("preset:smollm2-135m")
    info = eng.info
    assert not info.trained and info.family == "llama" and info.n_params == 134_515_008
    assert info.kv_bytes_per_token == 46_080
    assert info.weight_bytes == 134_515_008 * 4  # one (d, V) matrix serves embedding and LM head
    res = eng.generate([[1, 2, 3, 4]], max_new_tokens=3, stop_at_eos=False)
    assert len(res.tokens[0]) == 3 and all(0 <= t < 49152 for t in res.tokens[0])
    codec = chef_codec()
    if codec is not None:
        assert eng.decode([codec.known + 5]) == f"⟨{codec.known + 5}⟩"
        assert eng.generate(["ROMEO:"], max_new_tokens=2).texts[0] is not None


def test_matmul_flops_equal_what_torch_counts(tiny_llama, tiny_gpt2):
    """FlopCounterMode counts every GEMM the model really runs (not CPU SDPA): our formula minus its
    attention term must equal that count exactly, for a prefill and for a decode-shaped pass."""
    for tiny in (tiny_llama, tiny_gpt2):
        eng = Engine.load(str(tiny.path))
        cfg, T = eng.cfg, 9
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            eng.model(torch.arange(T)[None], torch.arange(T)[None])
        cost = step_cost(cfg, 1, T, T, 4, logits_rows=T, attn_pairs=T * T)
        attention = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * T * T
        assert cost.flops - attention == counter.get_total_flops()


def test_smollm2_decode_cost_worked_example():
    cfg = preset_config("smollm2-135m")
    cost = step_cost(cfg, batch=1, tokens=1, kv_tokens=101, dtype_bytes=4, logits_rows=1)
    assert cost.flops == pytest.approx(275.9e6, rel=1e-3)
    assert weight_bytes(cfg, 4) == (134_515_008) * 4
    assert cost.bytes_moved == pytest.approx(134_515_008 * 4 + 102 * 46_080 + 576 * 4 + 49152 * 4)
    assert 0.45 < cost.intensity < 0.55  # ~2 FLOP per 4-byte weight: memory-bound
    prefill = step_cost(cfg, batch=1, tokens=512, kv_tokens=512, dtype_bytes=4, logits_rows=1)
    assert prefill.intensity > 100 * cost.intensity  # the wok is compute-bound


def test_all_presets_are_listed_in_the_docs():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "engine-api.md").read_text()
    assert all(name in doc for name in PRESETS)
