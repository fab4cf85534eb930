"""int8 quantization (engine/quant.py) against float32 references.

Tolerances, stated before the numbers they bound: int8 rounding moves each weight by at most half
its block's scale (max |block| / 254) plus the scale's float16 rounding (127 x 2^-11 of a step);
every product also rounds each 32-wide block of activations to 8 bits over its own range (a move of
at most max |block| / 254 per input). A logit should move by well under 2 % of the logits' range;
measured on these tiny models: 0.36-0.71 % of the range against HF float32, every argmax equal
(`test_logits_within_tolerance_of_transformers_fp32`; one range per activation row gave 0.43-0.89 %).
Greedy decoding on random tiny models meets near-ties, so "mostly agree" is checked as: the first
8 greedy tokens equal HF's on every family and >= 90 % of one pass's argmax positions equal.
"""

import numpy as np
import pytest
import torch

from engine import Engine, EngineError, native_build, native_ops
from engine.cli import main as cli_main
from engine.costs import scale_count
from engine.events import Done
from engine.int8_op import emulated_product
from engine.quant import Int8Weight, matmul, parse_quant, quantize_blocks
from lab import kitchens

FAMILIES = ["tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gpt2", "tiny_starcoder2", "tiny_olmo"]
PROMPT = [11, 57, 3, 200, 42, 9, 101, 7]
LOGIT_TOL = 0.02  # of the float32 logits' range (max - min)
NATIVE = native_build.ready()  # the engine's own int8 kernel is built here (else the torch emulation serves)


@pytest.fixture(params=FAMILIES)
def tiny(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
def no_native(monkeypatch):
    """Int8Weights made as where the engine's own kernels are not built: the torch emulation of the rule."""
    import engine.quant as quant

    monkeypatch.setattr(quant.native_build, "ready", lambda: False)


def test_bad_quant_is_refused_in_one_line(tiny_llama, capsys):
    with pytest.raises(EngineError, match="invalid quant 'int4'") as err:
        Engine.load(str(tiny_llama.path), quant="int4")
    assert "\n" not in str(err.value)
    assert parse_quant(None) is None and parse_quant("none") is None and parse_quant("int8") == "int8"
    code = cli_main(["generate", "--model", str(tiny_llama.path), "--prompt-ids", "1,2", "--quant", "fp4"])
    assert code == 2 and capsys.readouterr().err.count("\n") == 1


def _block_bound(x: torch.Tensor, deq: torch.Tensor) -> torch.Tensor:
    """|error| bound (M, out) of a product against x @ deq^T: each input moves by at most half an
    8-bit step of its 32-wide block's range (r_g / 254), times the weights it meets."""
    M, K = x.shape
    G = -(-K // 32)
    xb = torch.nn.functional.pad(x.double().abs(), (0, G * 32 - K)).view(M, G, 32)
    step = (xb.amax(-1) / 254).repeat_interleave(32, 1)[:, :K]  # (M, K) each input's half step
    return step @ deq.abs().t() * (1 + 1e-6) + 1e-5  # (M, out)


def test_our_int8_is_llama_cpps_q8_0_value_for_value():
    """Quantizing a float weight gives exactly what the gguf library (llama.cpp's own Python) writes
    for a Q8_0 tensor: the int8 values and the float16 scales, an all-zero block and ties included."""
    from gguf import GGMLQuantizationType, quants

    from engine.gguf import q8_0_blocks

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 160, generator=gen) * torch.rand(48, 1, generator=gen) * 4  # (out, in)
    w[3, 32:64] = 0.0
    w[5, :32] = torch.arange(32) - 15.5  # with 127 in the block, d = 1 and x / d lands on .5: ties go away from zero
    w[5, 31] = 127.0
    raw = quants.quantize(w.numpy(), GGMLQuantizationType.Q8_0)
    values, scales = q8_0_blocks(type("Tensor", (), {"data": raw})())
    q, scale = quantize_blocks(w)
    assert np.array_equal(q.numpy(), values) and scale.dtype == torch.float16 and np.array_equal(scale.numpy(), scales)


def test_int8_blocks_taken_as_they_are_are_checked_in_one_line():
    q = torch.randint(-127, 128, (8, 64), dtype=torch.int8)
    qw = Int8Weight(blocks=(q, torch.rand(8, 2)))
    assert torch.equal(qw.q, q) and qw.shape == (64, 8)
    for bad in ((q, torch.rand(8, 1)), (q.int(), torch.rand(8, 2)), (torch.full((8, 64), -128, dtype=torch.int8), torch.rand(8, 2))):
        with pytest.raises(EngineError, match="int8 blocks: .* want int8 values in -127..127 and a scale per 32 inputs") as err:
            Int8Weight(blocks=bad)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("width", [64, 40])  # 40: a block of 32 and a short one of 8
@pytest.mark.parametrize("rows", [1, 3, 64, 65, 200])
def test_int8_weight_matches_its_own_dequantized_product(rows, width):
    """Any number of rows: W8A8 in 32-wide blocks, within the blocks' rounding bound of the
    dequantized product done in float64; an outlier input coarsens only its own block."""
    gen = torch.Generator().manual_seed(rows + width)
    w_t = torch.randn(width, 96, generator=gen)  # (in, out)
    x = torch.randn(rows, width, generator=gen)
    x[:, 5] *= 100.0  # an outlier feature, as real activations have
    qw = Int8Weight(w_t)
    assert qw.q.dtype == torch.int8 and qw.q.shape == (96, width) and qw.shape == (width, 96)
    assert qw.scale.shape == (96, -(-width // 32)) and qw.native == NATIVE
    deq = qw.dequantized().t().double()  # (out, in)
    wb = torch.nn.functional.pad(w_t.t().double().abs(), (0, -width % 32)).view(96, -1, 32).amax(-1)  # (out, G)
    step = (qw.scale.double() * (0.5 + 127 * 2**-11)).repeat_interleave(32, 1)[:, :width]
    assert (deq - w_t.t().double()).abs().le(step + 1e-7).all()  # the weight's rounding bound
    assert torch.allclose(qw.scale.double(), (wb / 127).half().double())
    y = qw(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 96)
    err = (y.double() - x.double() @ deq.t()).abs()
    assert (err <= _block_bound(x, deq)).all()
    assert (err > 0).any()  # really quantized activations: not the float product


def test_a_rows_product_is_the_same_bits_alone_or_among_others():
    """A row 1000x larger than its neighbours does not change them: each row's blocks have their own
    ranges, and the native kernel sums every row the same way whatever the other rows."""
    gen = torch.Generator().manual_seed(3)
    qw = Int8Weight(torch.randn(96, 80, generator=gen))
    x = torch.randn(70, 96, generator=gen)
    x[0] *= 1000.0
    y = qw(x)
    for m in (1, 33, 69):
        alone = qw(x[m : m + 1].clone())
        if NATIVE:
            assert torch.equal(y[m : m + 1], alone)
        else:
            torch.testing.assert_close(y[m : m + 1], alone, rtol=1e-5, atol=1e-5)


def test_int8_products_take_unaligned_and_strided_activations():
    qw = Int8Weight(torch.randn(64, 32))
    big = torch.randn(2, 64 + 3)
    for x in (big[:, 3:], big.t().contiguous().t()[:, :64]):  # a view past an aligned start; a strided one
        assert torch.equal(qw(x), qw(x.contiguous().clone()))


def test_logits_within_tolerance_of_transformers_fp32(tiny):
    eng = Engine.load(str(tiny.path), quant="int8")
    assert eng.info.quant == "int8"
    tokens = torch.randint(0, 320, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours = eng.model(tokens, torch.arange(13).expand(2, 13))
        ref = tiny.hf()(tokens).logits
    span = (ref.max() - ref.min()).item()
    assert (ours - ref).abs().max().item() <= LOGIT_TOL * span
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9


@pytest.mark.parametrize("length", [1, 64])
def test_decode_sized_passes_are_within_tolerance_of_transformers_fp32(tiny, length):
    """A decode step's few rows (and any other count: the same rule) stay within the tolerance."""
    eng = Engine.load(str(tiny.path), quant="int8")
    assert eng.model.lm_head_t.native == NATIVE
    tokens = torch.randint(0, 320, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        ours = eng.model(tokens, torch.arange(length).expand(1, length))
        ref = tiny.hf()(tokens).logits
    span = (ref.max() - ref.min()).item()
    assert (ours - ref).abs().max().item() <= LOGIT_TOL * span


def test_greedy_tokens_mostly_agree_with_transformers(tiny):
    res = Engine.load(str(tiny.path), quant="int8").generate([PROMPT], max_new_tokens=16)
    with torch.inference_mode():
        ref = tiny.hf().generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
    assert res.tokens[0][:8] == ref[0, len(PROMPT) : len(PROMPT) + 8].tolist()


def test_weights_are_int8_and_smaller(tiny_llama_tied):
    fp32 = Engine.load(str(tiny_llama_tied.path))
    eng = Engine.load(str(tiny_llama_tied.path), quant="int8")
    attn = eng.model.layers[0].attn
    assert isinstance(attn.wqkv_t, Int8Weight) and isinstance(eng.model.lm_head_t, Int8Weight)
    assert eng.model.dtype == torch.float32 and eng.model.embed.dtype == torch.float32  # embeddings stay
    cfg = eng.cfg
    embed_bytes = cfg.vocab_size * cfg.d_model * 4  # the tied model's own float embedding copy
    assert eng.info.weight_bytes - embed_bytes < 0.3 * fp32.info.weight_bytes
    assert eng.info.kv_bytes_per_token == fp32.info.kv_bytes_per_token  # the cache keeps the model dtype


def test_both_paths_give_the_same_tokens(tiny_qwen2):
    """A padded fixed batch (the lab's kitchen), an order on seats and the serving path (submit/step) agree in int8."""
    eng = Engine.load(str(tiny_qwen2.path), quant="int8")
    prompts = [PROMPT, PROMPT[:3]]
    padded = kitchens.generate(eng, prompts, max_new_tokens=12, batching="padded").tokens
    assert eng.generate(prompts, max_new_tokens=12).tokens == padded
    ids = [eng.submit(p, max_new_tokens=12) for p in prompts]
    served = {}
    while not eng.idle:
        served |= {ev.request_id: ev.result.tokens for ev in eng.step() if isinstance(ev, Done)}
    assert [served[i] for i in ids] == padded


def test_cli_generate_with_quant(tiny_llama, capsys):
    import json

    code = cli_main(["generate", "--model", str(tiny_llama.path), "--prompt-ids", "1,2,3",
                     "--max-new-tokens", "4", "--quant", "int8", "--json"])  # fmt: skip
    assert code == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"][0]) == 4


def test_without_the_engines_kernels_torch_computes_the_same_rule(tiny_llama, no_native):
    """Where the C kernels are not built (or on CUDA) the op rounds activations the same way and
    multiplies by the dequantized weight in float32: the native product up to float32's summation
    order. The engine then runs op by op, with the tokens of the native engine."""
    gen = torch.Generator().manual_seed(1)
    qw = Int8Weight(torch.randn(100, 96, generator=gen))
    assert not qw.native
    x = torch.randn(5, 100, generator=gen)
    x[:, 7] *= 50.0
    y = qw(x)
    assert torch.equal(y, emulated_product(x, qw.q, qw.scale))
    if NATIVE:
        torch.testing.assert_close(y, native_ops.int8_product(x, qw.q, qw.scale), rtol=1e-5, atol=1e-4)
    slow = Engine.load(str(tiny_llama.path), quant="int8")
    assert slow.native is None or not slow.native.ready  # its int8 weights are not the kernel's
    assert len(slow.generate([PROMPT], max_new_tokens=4).tokens[0]) == 4


def test_an_int8_trace_counts_the_bytes_an_int8_step_reads(tiny_llama):
    """The roofline and the inspector read `bytes_moved`: int8 matrices are one byte per weight."""
    from engine.costs import weight_bytes

    full = Engine.load(str(tiny_llama.path))
    small = Engine.load(str(tiny_llama.path), quant="int8")
    cfg = full.cfg
    kw = dict(max_new_tokens=4, stop_at_eos=False)
    a, b = full.generate([[5, 6, 7]], **kw).trace.steps, small.generate([[5, 6, 7]], **kw).trace.steps
    matrices = cfg.n_layers * cfg.layer_matmul_params() + cfg.vocab_size * cfg.d_model
    scales = scale_count(cfg)
    assert weight_bytes(cfg, 4) - weight_bytes(cfg, 4, quant="int8") == 3 * matrices - 2 * scales
    for x, y in zip(a, b, strict=True):  # same passes, same FLOPs, fewer bytes by exactly that
        assert x.flops == y.flops
        assert x.bytes_moved - y.bytes_moved == 3 * matrices - 2 * scales
    int8 = [m for m in small.model.modules() if isinstance(m, Int8Weight)]
    assert sum(m.q.numel() for m in int8) == matrices and sum(m.scale.numel() for m in int8) == scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 40, 200])  # 200: six whole blocks and a short one
@pytest.mark.parametrize("rows", [1, 3, 65])
def test_the_int8_op_is_the_engines_own_product_bit_for_bit(rows, width, dtype):
    """`twopot::int8_matmul` (engine/int8_op.py) is what every int8 product runs, eager and compiled:
    where the C kernels are built it is exactly native_ops.int8_product on the float32 input (the
    native step's arithmetic), for a 2-D or 3-D input, returned in the input's dtype."""
    if not NATIVE:
        pytest.skip("the engine's own kernels could not be built here")
    gen = torch.Generator().manual_seed(5 * rows + width)
    qw = Int8Weight(torch.randn(width, 96, generator=gen))
    x = torch.randn(rows, width, generator=gen).to(dtype)
    want = native_ops.int8_product(x.float(), qw.q, qw.scale).to(dtype)
    assert torch.equal(qw(x), want) and qw(x).dtype == dtype
    assert torch.equal(qw(x.view(1, rows, width)), want.view(1, rows, 96))
    assert torch.equal(matmul(x, qw.parts()), want)  # the compiled step's call: the same op


def test_the_int8_op_passes_torch_library_checks():
    """Schema, fake (meta) implementation and dynamic shapes, as torch.compile will use them, on the
    native kernel and on the torch emulation; compiled with a symbolic row count it gives the eager bits."""
    qw = Int8Weight(torch.randn(64, 48))
    p = qw.parts()
    for native in {False, p.native}:
        for rows, refine in ((1, False), (9, False), (3, True)):
            x = torch.randn(rows, 64)
            torch.library.opcheck(torch.ops.twopot.int8_matmul.default, (x, p.q, p.scale, native, refine),
                                  test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))  # fmt: skip
    compiled = torch.compile(lambda x: matmul(x, p), fullgraph=True, dynamic=True)
    for rows in (1, 3, 64, 65, 37):
        x = torch.randn(rows, 64)
        assert torch.equal(compiled(x), matmul(x, p))
    with torch.inference_mode():
        assert torch.equal(compiled(x[:2]), matmul(x[:2], p))
