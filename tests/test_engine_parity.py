"""Our engine against `transformers` on tiny random models of every family (float32, CPU).

If these pass, the name map, the fused/pre-transposed weights, RoPE / learned positions, GQA, biases
and the KV cache all compute what the reference implementation computes.
"""

import pytest
import torch

from engine import Engine, decode_one_token, prefill
from engine.batching import build_batch
from engine.kv_pool import SeatPool

# olmo: a Llama with parameter-free LayerNorms; starcoder2: LayerNorm and an ungated MLP with biases
FAMILIES = ["tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_olmo", "tiny_starcoder2", "tiny_gpt2"]
PROMPT = [11, 57, 3, 200, 42, 9, 101, 7]


@pytest.fixture(params=FAMILIES)
def tiny(request):
    return request.getfixturevalue(request.param)


def test_loaded_family_and_tying(tiny):
    eng = Engine.load(str(tiny.path))
    assert eng.info.family == tiny.family
    assert eng.model.cfg.tied == (tiny.path.name.startswith(("tiny_llama_tied", "tiny_qwen2", "tiny_starcoder2", "tiny_gpt2")))
    hf_params = sum(p.numel() for p in tiny.hf().parameters())  # HF counts tied weights once too
    assert eng.info.n_params == hf_params


def test_logits_match_transformers(tiny):
    eng = Engine.load(str(tiny.path))
    hf = tiny.hf()
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(13).expand(2, 13)
    with torch.inference_mode():
        ours = eng.model(tokens, positions)
        ref = hf(tokens).logits
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_greedy_matches_hf_generate_for_32_steps(tiny):
    eng = Engine.load(str(tiny.path))
    res = eng.generate([PROMPT], max_new_tokens=32, temperature=0.0)
    with torch.inference_mode():
        ref = tiny.hf().generate(
            torch.tensor([PROMPT]), max_new_tokens=32, do_sample=False, min_new_tokens=32
        )
    assert res.tokens[0] == ref[0, len(PROMPT) :].tolist()
    assert len(res.tokens[0]) == 32


def test_prefill_then_decode_equals_one_full_forward(tiny):
    """Logits of each decode step = logits of the same position in one pass over the whole sequence."""
    eng = Engine.load(str(tiny.path))
    model, cfg = eng.model, eng.model.cfg
    seq = PROMPT + [5, 77, 140, 3, 260, 18]
    n_decode = len(seq) - len(PROMPT)
    with torch.inference_mode():
        full = model(torch.tensor([seq]), torch.arange(len(seq))[None])[0]  # (T, V)
        batch = build_batch([PROMPT], "padded", "cpu", max_slots=len(seq))
        cache = SeatPool(cfg, 1, len(seq), torch.float32, "cpu")
        step_logits = [prefill(model, batch, cache)[0]]
        for i in range(n_decode):
            slot = len(PROMPT) + i
            mask = torch.ones(1, 1, 1, slot + 1, dtype=torch.bool)
            tok, pos = torch.tensor([[seq[slot]]]), torch.tensor([[slot]])
            step_logits.append(decode_one_token(model, tok, pos, torch.tensor([slot]), mask, cache)[0])
    for i, logits in enumerate(step_logits):
        torch.testing.assert_close(logits, full[len(PROMPT) - 1 + i], atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype, torch_dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_half_precision_runs_close_to_transformers(tiny_llama, dtype, torch_dtype):
    eng = Engine.load(str(tiny_llama.path), dtype=dtype)
    assert eng.info.dtype == dtype and eng.model.dtype == torch_dtype
    assert eng.info.kv_bytes_per_token == Engine.load(str(tiny_llama.path)).info.kv_bytes_per_token // 2
    hf = tiny_llama.hf().to(torch_dtype)
    tokens = torch.tensor([PROMPT])
    with torch.inference_mode():
        ours = eng.model(tokens, torch.arange(len(PROMPT))[None]).float()
        ref = hf(tokens).logits.float()
    torch.testing.assert_close(ours, ref, atol=3e-2, rtol=0)
    res = eng.generate([PROMPT, PROMPT[:3]], max_new_tokens=8)
    assert [len(t) for t in res.tokens] == [8, 8]
    # 16-bit CPU weights lie (out, in) in memory under their (in, out) view: the faster layout there
    w = eng.model.layers[0].attn.wqkv_t  # (d, q + 2kv)
    assert w.stride() == (1, w.shape[0]) and w.t().is_contiguous()
    assert res.metrics.kv_cache_allocated_bytes == 2 * (8 + 7) * eng.info.kv_bytes_per_token


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    from conftest import make_tiny_model

    scaling = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # fmt: skip
    tiny = make_tiny_model(tmp_path / "llama3", "llama", tied=True, rope_parameters=scaling)
    eng = Engine.load(str(tiny.path))
    assert eng.cfg.rope_scaling is not None
    tokens = torch.randint(0, 320, (1, 120), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ours = eng.model(tokens, torch.arange(120)[None])
        ref = tiny.hf()(tokens).logits
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_mistral_config_loads_as_llama_with_window_as_context(tiny_llama, tmp_path):
    import json
    import shutil

    folder = tmp_path / "mistral"
    shutil.copytree(tiny_llama.path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg |= {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 64}
    (folder / "config.json").write_text(json.dumps(cfg))
    eng = Engine.load(str(folder))
    assert eng.info.family == "llama" and eng.info.max_context == 64
    assert (
        eng.generate([PROMPT], max_new_tokens=8).tokens
        == Engine.load(str(tiny_llama.path)).generate([PROMPT], max_new_tokens=8).tokens
    )


def test_the_trained_chef_matches_transformers():
    """The shipped model, not a random one: same greedy text as HF `generate` for 48 tokens."""
    from conftest import REPO

    chef = REPO / "engine" / "models" / "chef"
    if not (chef / "model.safetensors").is_file():
        pytest.skip("engine/models/chef not present")
    from transformers import AutoModelForCausalLM

    eng = Engine.load(str(chef))
    ids = eng.encode("ROMEO:\nWhat light")
    res = eng.generate([ids], max_new_tokens=48, stop_at_eos=False)
    with torch.inference_mode():
        hf = AutoModelForCausalLM.from_pretrained(str(chef)).float().eval()
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=48, min_new_tokens=48, do_sample=False)
    assert res.tokens[0] == ref[0, len(ids) :].tolist()
    assert res.texts[0] == eng.decode(res.tokens[0]) and res.texts[0].strip()


def test_batched_decode_does_one_gemm_per_weight(tiny):
    """At batch 4 a decode step multiplies each weight matrix ONCE: 4 GEMMs per layer + the LM head.

    Guards a trap met while rewriting RMSNorm: the tied embedding gather yields a column-major
    (B, 1, d) activation, elementwise ops keep that layout, and `x @ W` on it cannot fold the
    batch into one GEMM, so it ran one GEMV per sequence, each reading all of W (a batch-32
    SmolLM2-135M step took 261 ms instead of 110 ms). Attention is the only batched matmul: two
    per layer.
    """
    from torch.profiler import profile

    eng = Engine.load(str(tiny.path))
    model, cfg = eng.model, eng.model.cfg
    prompts = [PROMPT, PROMPT[:5], PROMPT[:3] + [1], PROMPT[2:]]
    slot = len(PROMPT)
    with torch.inference_mode():
        batch = build_batch(prompts, "padded", "cpu", max_slots=slot + 1)
        cache = SeatPool(cfg, 4, slot + 1, torch.float32, "cpu")
        nxt = prefill(model, batch, cache).argmax(-1)[:, None]  # (4, 1)
        mask = torch.cat([batch.valid[:, :slot], torch.ones(4, 1, dtype=torch.bool)], 1)[:, None, None]
        positions = torch.tensor([[len(p)] for p in prompts])
        with profile() as prof:
            decode_one_token(model, nxt, positions, torch.tensor([slot]), mask, cache)
    names = [e.name for e in prof.events()]
    assert names.count("aten::mm") == 4 * cfg.n_layers + 1
    assert names.count("aten::bmm") == 2 * cfg.n_layers


def test_a_family_that_differs_by_its_norm_and_mlp_is_one_family_entry(tiny_starcoder2):
    """StarCoder2 is one `Family` entry (engine/config.py): LayerNorm with bias, an ungated MLP with
    biases. The tests above hold it to HF's logits and greedy tokens like every other family."""
    from engine.config import FAMILIES

    cfg = Engine.load(str(tiny_starcoder2.path)).model.cfg
    assert FAMILIES["starcoder2"].name == cfg.family == "starcoder2"
    assert (cfg.norm, cfg.mlp_gated, cfg.qkv_bias, cfg.out_bias, cfg.positions) == ("layer", False, True, True, "rope")
