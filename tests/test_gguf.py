"""GGUF files as a model source, against transformers' own GGUF loader (`from_pretrained(gguf_file=...)`).

Each family the engine serves is written as a tiny random GGUF (tests/gguf_kit.py) in each accepted
tensor type; our logits and greedy tokens must equal transformers' on the same file. transformers
reads no OLMo GGUF, so OLMo's reference is the original HF model (F32: the file holds its exact
weights) or HF loading the file converted to a safetensors folder (engine/model_store.py `convert`).
"""

import sys

import numpy as np
import pytest
import torch

from engine import Engine, EngineError
from engine.gguf import ACCEPTED_TYPES, llama3_rope, q8_0_blocks, read_gguf, unpermute
from engine.model_store import convert
from engine.quant import Int8Weight
from tests.conftest import make_tiny_model, train_tiny_tokenizer
from tests.gguf_kit import write_gguf
from tests.proc_kit import run, said

FAMILIES = ["llama", "qwen2", "olmo", "starcoder2", "gpt2"]
HF_READS_GGUF = {"llama", "qwen2", "starcoder2", "gpt2"}
PROMPT = [11, 57, 3, 200, 42, 9, 101, 7, 250, 33]
# Wide enough for the K-quants' blocks of 256 values per row; llama untied (its own output matrix).
# GPT-2 at n_positions 1024: transformers reads a GGUF's context into n_ctx and keeps its default n_positions.
SHAPES = {"gpt2": dict(n_embd=256, n_head=4, n_positions=1024), "olmo": dict(hidden_size=256, intermediate_size=512, tie_word_embeddings=True)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny model per family, 256 wide, with the fable's byte-level BPE tokenizer."""
    models = {}
    for seed, family in enumerate(FAMILIES):
        path = tmp_path_factory.mktemp(f"gguf_{family}")
        shape = SHAPES.get(family, dict(hidden_size=256, intermediate_size=512))
        models[family] = make_tiny_model(path, family, tied=family != "llama", seed=seed, **shape)
        train_tiny_tokenizer(path)
    return models


def hf_reference(family: str, gguf_path, original, tmp_path):
    from transformers import AutoModelForCausalLM

    if family in HF_READS_GGUF:
        return AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                    dtype=torch.float32).eval()  # fmt: skip
    if "F32" in gguf_path.name:
        return original.hf()
    folder = convert(gguf_path, tmp_path / "converted")
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("kind", ACCEPTED_TYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_logits_and_greedy_match_transformers(tiny, family, kind, tmp_path):
    path = write_gguf(tiny[family].path, tmp_path / f"{family}-{kind}.gguf", kind)
    eng = Engine.load(str(path))
    hf = hf_reference(family, path, tiny[family], tmp_path)
    assert eng.info.family == family and eng.model.cfg.tied == (family != "llama")
    tokens = torch.tensor([PROMPT])
    with torch.inference_mode():
        ours = eng.model(tokens, torch.arange(len(PROMPT)).expand(1, -1))
        ref = hf(tokens).logits
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)
    res = eng.generate([PROMPT], max_new_tokens=8, stop_at_eos=False)
    assert res.tokens[0] == hf_greedy(hf, PROMPT, 8)


@pytest.mark.parametrize("kind", ["Q4_K", "Q8_0"])
def test_blocks_are_dequantized_to_the_chosen_dtype(tiny, tmp_path, kind):
    path = write_gguf(tiny["qwen2"].path, tmp_path / f"qwen2-{kind}.gguf", kind)
    full, half = Engine.load(str(path)), Engine.load(str(path), dtype="bfloat16")
    assert half.model.layers[0].attn.wqkv_t.dtype == torch.bfloat16 and half.info.dtype == "bfloat16"
    assert torch.equal(half.model.layers[0].attn.wqkv_t, full.model.layers[0].attn.wqkv_t.to(torch.bfloat16))


def test_f32_gguf_holds_the_original_weights(tiny, tmp_path):
    """The writer and our reader are inverses: transformers on the GGUF == the HF model it came from."""
    path = write_gguf(tiny["llama"].path, tmp_path / "llama.gguf", "F32")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.inference_mode():
        torch.testing.assert_close(hf(torch.tensor([PROMPT])).logits, tiny["llama"].hf()(torch.tensor([PROMPT])).logits)


def test_llama3_rescaled_rope_is_read_from_rope_freqs(tmp_path):
    """Llama 3.1+ GGUFs carry their RoPE rescaling as `rope_freqs` (transformers' GGUF reader ignores it):
    ours must compute what the original HF model computes, over positions where the rescaling shows."""
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    shape = dict(hidden_size=256, intermediate_size=512, max_position_embeddings=16384)
    src = make_tiny_model(tmp_path / "src", "llama", seed=11, rope_scaling=scaling, **shape)
    plain = make_tiny_model(tmp_path / "plain", "llama", seed=11, **shape)  # the same weights, plain RoPE
    eng = Engine.load(str(write_gguf(src.path, tmp_path / "llama3.gguf", "F32")))
    assert eng.cfg.rope_scaling["factor"] == 32.0
    ids = torch.randint(0, 320, (1, 120), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours = eng.model(ids, torch.arange(120)[None])
        torch.testing.assert_close(ours, src.hf()(ids).logits, atol=2e-4, rtol=1e-4)
        assert (ours - plain.hf()(ids).logits).abs().max() > 1e-3  # plain RoPE would have failed the check


def test_rope_factors_of_another_rule_are_refused_in_one_line():
    config = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512,
              "num_attention_heads": 4, "vocab_size": 320, "rope_theta": 10000.0}  # fmt: skip
    with pytest.raises(EngineError, match="by a rule other than Llama 3's") as err:
        llama3_rope(np.full(32, 3.0, dtype=np.float32), config, "odd.gguf")
    assert "\n" not in str(err.value)


def test_tokenizer_and_chat_template_come_from_the_file(tiny, tmp_path):
    from transformers import AutoTokenizer

    path = write_gguf(tiny["qwen2"].path, tmp_path / "qwen2.gguf", "Q8_0")
    eng = Engine.load(str(path))
    hf_tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    text = "The wok tosses everything at once; the pot ladles."
    assert eng.encode(text) == hf_tok.encode(text, add_special_tokens=False)
    assert eng.info.has_chat_template and eng.decode(eng.encode(text)) == text
    messages = [{"role": "user", "content": "Two pots?"}]
    prompt = eng.codec.chat_prompt(messages)
    assert prompt.text == hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.ids == eng.encode(prompt.text) and prompt.template_tokens == len(prompt.ids) - len(eng.encode("Two pots?"))


def test_a_gguf_without_a_vocabulary_takes_token_ids(tiny, tmp_path):
    path = write_gguf(tiny["llama"].path, tmp_path / "bare.gguf", "F16", tokenizer=False)
    eng = Engine.load(str(path))
    assert not eng.info.has_tokenizer and not eng.info.has_chat_template
    assert len(eng.generate([PROMPT], max_new_tokens=3, stop_at_eos=False).tokens[0]) == 3


def test_q8_0_blocks_are_int8_values_and_32_wide_scales(tiny, tmp_path):
    import gguf

    path = write_gguf(tiny["llama"].path, tmp_path / "q8.gguf", "Q8_0")
    tensor = read_gguf(path).tensors["blk.0.attn_v.weight"]
    values, scales = q8_0_blocks(tensor)
    assert values.dtype == np.int8 and values.shape == (128, 256) and scales.shape == (128, 8)
    rebuilt = values.reshape(128, 8, 32) * scales[:, :, None].astype(np.float32)
    np.testing.assert_array_equal(rebuilt.reshape(128, 256), gguf.dequantize(tensor.data, tensor.tensor_type))


Q8_0_LOGIT_TOL = 0.02  # of the float logits' range: only the activations' 8-bit rounding differs (tests/test_quant.py)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])  # llama: q/k rows permuted in the file; gpt2: transposed
def test_a_q8_0_gguf_loads_into_int8_as_the_file_holds_it(tiny, tmp_path, family):
    """quant="int8" on a Q8_0 file takes its int8 values and float16 scales as they are: layer 0's fused
    q|k|v is the file's three tensors (q and k rows unpermuted), value for value and scale for scale,
    and every matrix dequantizes to exactly the floats the same file loads as. GPT-2 stored its
    matrices transposed, so its blocks run along the other axis: they are quantized again from those
    floats. The logits differ from the float load's only by the activations' rounding: measured
    0.45-0.66 % of the range (every argmax equal), bound Q8_0_LOGIT_TOL."""
    path = write_gguf(tiny[family].path, tmp_path / f"{family}.gguf", "Q8_0")
    floats, eng = Engine.load(str(path)), Engine.load(str(path), quant="int8")
    file = read_gguf(path)
    if family != "gpt2":
        cfg, parts = eng.cfg, []
        for name, heads in (("attn_q", eng.cfg.n_heads), ("attn_k", eng.cfg.n_kv_heads), ("attn_v", None)):
            values, scales = q8_0_blocks(file.tensors[f"blk.0.{name}.weight"])
            q, s = torch.from_numpy(values), torch.from_numpy(scales)  # int8, float16
            parts.append((unpermute(q, heads), unpermute(s, heads)) if family == "llama" and heads else (q, s))
        qkv = eng.model.layers[0].attn.wqkv_t
        assert torch.equal(qkv.q, torch.cat([p[0] for p in parts])) and torch.equal(qkv.scale, torch.cat([p[1] for p in parts]))
        assert cfg.q_dim + 2 * cfg.kv_dim == qkv.q.shape[0]
    int8 = {n: m for n, m in eng.model.named_modules() if isinstance(m, Int8Weight)}
    assert len(int8) == 4 * eng.cfg.n_layers + 1
    for name, qw in int8.items():
        want = floats.model.get_buffer(name)  # (in, out) float32, the file's blocks dequantized
        if family != "gpt2":
            assert torch.equal(qw.dequantized(), want), name
        else:
            assert qw.dequantized().sub(want).abs().max() <= qw.scale.max() * 0.6, name
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        got, ref = eng.model(ids, torch.arange(len(PROMPT)).unsqueeze(0)), floats.model(ids, torch.arange(len(PROMPT)).unsqueeze(0))
    span = (ref.max() - ref.min()).item()
    assert (got - ref).abs().max().item() <= Q8_0_LOGIT_TOL * span
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9


def test_an_unsupported_type_is_refused_in_one_line(tiny, tmp_path):
    path = write_gguf(tiny["llama"].path, tmp_path / "q5.gguf", "Q5_0")
    with pytest.raises(EngineError) as err:
        Engine.load(str(path))
    msg = str(err.value)
    assert "\n" not in msg and "Q5_0" in msg and all(t in msg for t in ACCEPTED_TYPES)
    cli = run([sys.executable, "-m", "engine", "generate", "--model", str(path), "--prompt-ids", "1,2"],
              timeout=120, check=False)  # fmt: skip
    assert cli.returncode == 2 and cli.stderr.strip().count("\n") == 0 and "Q5_0" in cli.stderr, said(cli)


@pytest.mark.parametrize("bad", ["missing.gguf", "not-gguf"])
def test_a_missing_or_broken_gguf_is_one_line(tmp_path, bad):
    path = tmp_path / "model.gguf"
    if bad == "not-gguf":
        path.write_bytes(b"this is not a GGUF file at all" * 10)
    with pytest.raises(EngineError, match="gguf|GGUF") as err:
        Engine.load(str(path))
    assert "\n" not in str(err.value)
