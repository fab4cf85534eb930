"""int8 quantization (engine/quant.py) against float32 references.

Tolerances, stated before the numbers they bound: int8 rounding moves each weight by at most half
its row's scale (max|row| / 254, ~0.4 % of the row's largest weight); a decode-sized pass (at most
W8A8_MAX_ROWS rows) quantizes each activation row to 8 bits too (a move of at most max|row| / 127.5
per input), a longer one rounds activations to bfloat16 (2^-9 relative). Either way a logit should
move by well under 2 % of the logits' range; measured on these tiny models (2026-12-01): W8A8 passes
0.43-0.89 %, bf16-activation passes 0.34-0.64 % of the range against HF float32.
Greedy decoding on random tiny models meets near-ties, so "mostly agree" is checked as: the first
8 greedy tokens equal HF's on every family (measured: the first difference at token 16 on the
untied llama and olmo, 26 on qwen2, none in 32 on the others, W8A8 and W8A16 decode alike) and >= 90 % of
one pass's argmax positions equal (measured 96-100 %).
"""

import pytest
import torch

from engine import Engine, EngineError, int8_op
from engine.cli import main as cli_main
from engine.events import Done
from engine.int8_op import W8A8_MAX_ROWS, w8a8_product
from engine.quant import KERNEL_MAX_ROWS, Int8Weight, matmul, parse_quant
from lab import kitchens

FAMILIES = ["tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gpt2", "tiny_starcoder2", "tiny_olmo"]
PROMPT = [11, 57, 3, 200, 42, 9, 101, 7]
LOGIT_TOL = 0.02  # of the float32 logits' range (max - min)


@pytest.fixture(params=FAMILIES)
def tiny(request):
    return request.getfixturevalue(request.param)


def w8a8_serves(qw: Int8Weight) -> bool:
    """A W8A8 kernel serves this weight's few-row products: the engine's own (engine/native_build.py,
    where it is built) or, without it, fbgemm's pack (where this CPU's fbgemm passed its probe)."""
    return qw.rowsum is not None or qw.w8a8 is not None


@pytest.fixture
def fbgemm(monkeypatch):
    """Int8Weights made as where the engine's own kernels are not built: fbgemm's W8A8 pack, or W8A16."""
    import engine.quant as quant

    monkeypatch.setattr(quant.native_build, "ready", lambda: False)


def test_bad_quant_is_refused_in_one_line(tiny_llama, capsys):
    with pytest.raises(EngineError, match="invalid quant 'int4'") as err:
        Engine.load(str(tiny_llama.path), quant="int4")
    assert "\n" not in str(err.value)
    assert parse_quant(None) is None and parse_quant("none") is None and parse_quant("int8") == "int8"
    code = cli_main(["generate", "--model", str(tiny_llama.path), "--prompt-ids", "1,2", "--quant", "fp4"])
    assert code == 2 and capsys.readouterr().err.count("\n") == 1


def _w8a8_bound(x: torch.Tensor, deq: torch.Tensor) -> torch.Tensor:
    """|error| bound (M, out) of a W8A8 product against x @ deq^T: each activation moves by at most one
    8-bit step of its row's range (r / 127.5 for a row with largest |x| = r; half a step from
    rounding, half from the kernel's integer zero point), times the channel's sum of |weights|."""
    r = x.double().abs().amax(1, keepdim=True)  # (M, 1)
    return r / 127.5 * deq.abs().sum(1) + 1e-5  # (M, out)


@pytest.mark.parametrize("width", [64, 40])  # 40: not a multiple of 16, so never the W8A16 kernel
@pytest.mark.parametrize("rows", [1, 3, W8A8_MAX_ROWS, W8A8_MAX_ROWS + 1, 37])
def test_int8_weight_matches_its_own_dequantized_product(rows, width):
    """Few rows: W8A8, within its 8-bit activation bound; more: bf16(x) @ q with float32 sums, scaled.
    Either compared with the dequantized product done in float64."""
    gen = torch.Generator().manual_seed(rows + width)
    w_t = torch.randn(width, 96, generator=gen)  # (in, out)
    x = torch.randn(rows, width, generator=gen)
    qw = Int8Weight(w_t)
    assert qw.q.dtype == torch.int8 and qw.q.shape == (96, width) and qw.shape == (width, 96)
    assert w8a8_serves(qw)
    deq = qw.q.double() * qw.scale.double()[:, None]  # (out, in)
    assert (deq - w_t.t().double()).abs().le(qw.scale.double()[:, None] / 2 + 1e-6).all()  # rounding bound
    y = qw(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 96)
    if rows <= W8A8_MAX_ROWS:
        err = (y.double() - x.double() @ deq.t()).abs()
        assert (err <= _w8a8_bound(x, deq)).all()
        assert (err > 0).any()  # really quantized activations: not the float product
    else:
        ref = x.bfloat16().double() @ deq.t()  # (rows, out)
        torch.testing.assert_close(y.double(), ref, rtol=2**-7, atol=1e-3)  # bf16 result: 8-bit significand


def test_w8a8_quantizes_each_row_with_its_own_range():
    """A row 1000x larger than its neighbours must not coarsen them: every row stays within the bound
    of its own range, and a row's product is close to the one it gets alone."""
    gen = torch.Generator().manual_seed(3)
    qw = Int8Weight(torch.randn(64, 96, generator=gen))
    x = torch.randn(4, 64, generator=gen)
    x[0] *= 1000.0
    deq = qw.q.double() * qw.scale.double()[:, None]  # (out, in)
    y = qw(x)
    assert ((y.double() - x.double() @ deq.t()).abs() <= _w8a8_bound(x, deq)).all()
    for m in range(1, 4):
        alone = qw(x[m : m + 1])
        torch.testing.assert_close(y[m : m + 1], alone, rtol=0, atol=2 * _w8a8_bound(x[m : m + 1], deq).max().item())


def test_int8_kernel_survives_unaligned_activations():
    """The CPU kernel's aligned loads: a view that starts mid-buffer must not reach it as is."""
    qw = Int8Weight(torch.randn(64, 32))
    big = torch.randn(1, 64 + 3).bfloat16()
    x = big[:, 3:]  # bf16 view, 6 bytes past an aligned start
    torch.testing.assert_close(qw(x).float(), qw(x.clone()).float())


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


@pytest.mark.parametrize("length", [1, W8A8_MAX_ROWS])
def test_few_row_passes_are_w8a8_and_within_tolerance_of_transformers_fp32(tiny, length):
    """A pass of at most W8A8_MAX_ROWS tokens (a decode step's row count) runs every product in W8A8."""
    eng = Engine.load(str(tiny.path), quant="int8")
    assert w8a8_serves(eng.model.lm_head_t)
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


def test_without_a_working_kernel_every_product_takes_the_widened_path(monkeypatch, fbgemm):
    """Where both int8 kernels are missing or wrong (each probed once), the bf16 GEMM serves all rows."""
    import engine.quant as quant

    assert quant.kernel_works(torch.device("cpu"))  # this CPU's AVX-512 kernel, probed on a small product
    w_t, x = torch.randn(64, 96), torch.randn(3, 64)
    monkeypatch.setitem(int8_op._W8A8_WORKS, "cpu", False)
    with_kernel = Int8Weight(w_t)
    monkeypatch.setitem(quant._KERNEL_WORKS, "cpu", False)
    without = Int8Weight(w_t)
    assert with_kernel.use_kernel and not without.use_kernel and without.w8a8 is None
    torch.testing.assert_close(without(x), with_kernel(x), rtol=2**-7, atol=1e-3)


def _saturating(x, q, packed, col_offsets, w_scale, w_zp, bias):
    """fbgemm's product as a CPU without VNNI would give it on the probe: pair sums clipped to int16."""
    sums = x.div(x.abs().amax() / 255).round() @ q.float().t()  # (M, out) exact integer sums
    return sums.clamp(max=32767 * q.shape[1] / 2) * (x.abs().amax() / 255)


@pytest.mark.parametrize("broken", ["missing", "saturating"])
def test_without_w8a8_the_few_rows_take_the_w8a16_kernel_as_before(broken, tiny_llama, monkeypatch, fbgemm):
    """A torch without fbgemm's legacy W8A8 entry points, or a CPU where it saturates, gets no pack and
    today's W8A16 kernel (the old Int8Weight.forward bit for bit), without an error."""
    monkeypatch.setattr(int8_op, "_W8A8_WORKS", {})
    if broken == "missing":
        monkeypatch.delattr(torch, "fbgemm_linear_int8_weight_fp32_activation")
    else:
        monkeypatch.setattr(torch, "fbgemm_linear_int8_weight_fp32_activation", _saturating)
    qw = Int8Weight(torch.randn(64, 96))
    assert not int8_op.w8a8_works() and qw.w8a8 is None and qw.kernel_scale is None and qw.use_kernel
    for rows in (1, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 1):
        x = torch.randn(rows, 64)
        assert torch.equal(qw(x), _old_forward(qw, x))
    eng = Engine.load(str(tiny_llama.path), quant="int8")
    assert eng.model.lm_head_t.w8a8 is None
    assert len(eng.generate([PROMPT], max_new_tokens=4).tokens[0]) == 4


def test_an_int8_trace_counts_the_bytes_an_int8_step_reads(tiny_llama):
    """The roofline and the inspector read `bytes_moved`: int8 matrices are one byte per weight."""
    from engine.costs import weight_bytes

    full = Engine.load(str(tiny_llama.path))
    small = Engine.load(str(tiny_llama.path), quant="int8")
    cfg = full.cfg
    kw = dict(max_new_tokens=4, stop_at_eos=False)
    a, b = full.generate([[5, 6, 7]], **kw).trace.steps, small.generate([[5, 6, 7]], **kw).trace.steps
    matrices = cfg.n_layers * cfg.layer_matmul_params() + cfg.vocab_size * cfg.d_model
    channels = cfg.n_layers * (cfg.q_dim + 2 * cfg.kv_dim + 2 * cfg.d_model + 2 * cfg.ffn_dim) + cfg.vocab_size
    assert weight_bytes(cfg, 4) - weight_bytes(cfg, 4, quant="int8") == 3 * matrices - 2 * channels
    for x, y in zip(a, b, strict=True):  # same passes, same FLOPs, fewer bytes by exactly that
        assert x.flops == y.flops
        assert x.bytes_moved - y.bytes_moved == 3 * matrices - 2 * channels
    assert sum(q.numel() for q in (m.q for m in small.model.modules() if hasattr(m, "q"))) == matrices


def _old_forward(qw: Int8Weight, x: torch.Tensor) -> torch.Tensor:
    """Int8Weight.forward on CPU as it was before the op existed (git 6ed7b36), the reference the op must equal."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, qw.in_features).to(torch.bfloat16)
    if qw.use_kernel and x2.shape[0] <= KERNEL_MAX_ROWS:
        if x2.data_ptr() % 64 or not x2.is_contiguous():
            x2 = x2.clone(memory_format=torch.contiguous_format)
        y = torch.ops.aten._weight_int8pack_mm(x2, qw.q, qw.scale)
    else:
        y = (x2 @ qw.q.t().to(torch.bfloat16)).mul_(qw.scale)
    return y.to(x.dtype).view(*lead, qw.out_features)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 40])
@pytest.mark.parametrize("rows", [1, W8A8_MAX_ROWS, W8A8_MAX_ROWS + 1, 37])
def test_the_int8_op_equals_its_kernels_bit_for_bit(rows, width, dtype, fbgemm):
    """`twopot::int8_matmul` (engine/int8_op.py) is what every int8 product runs, eager and compiled:
    eagerly it must be exactly the kernel its row count picks -- `w8a8_product` for few rows, for more
    the widened bf16 GEMM scaled in float32 -- also for a 3-D input and an unaligned view. (Without a
    pack it is the old Int8Weight.forward: test_without_w8a8_the_few_rows_take_the_w8a16_kernel_as_before.)"""
    gen = torch.Generator().manual_seed(7 * rows + width)
    qw = Int8Weight(torch.randn(width, 96, generator=gen))
    base = torch.randn(rows * width + 3, generator=gen).to(dtype)
    for x in (base[: rows * width].view(rows, width), base[3:].view(rows, width),  # aligned, unaligned start
              base[: rows * width].view(1, rows, width)):  # fmt: skip
        y = qw(x)
        x2 = x.reshape(rows, width)  # (M, in)
        if rows <= W8A8_MAX_ROWS:
            want = w8a8_product(x2, qw.q, qw.w8a8)
        else:
            want = (x2.bfloat16() @ qw.q.t().bfloat16()).float().mul_(qw.w8a8.scale)
        want = want.to(dtype).view(*x.shape[:-1], 96)
        assert torch.equal(y, want) and y.dtype == dtype
        assert torch.equal(y, matmul(x, qw.parts()))  # the compiled step's call: the same op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 40, 200])  # 200: a 64-byte block and a tail
@pytest.mark.parametrize("rows", [1, 3, W8A8_MAX_ROWS, W8A8_MAX_ROWS + 1])
def test_the_int8_op_is_the_engines_own_w8a8_where_it_is_built(rows, width, dtype):
    """Where engine/native_step.c is built, few-row products are its W8A8 (the native step's
    arithmetic), scaled in float32: bit for bit, a row's product is the same alone or among others."""
    from engine import native_build, native_ops

    if not native_build.ready():
        pytest.skip("the engine's own kernels could not be built here")
    gen = torch.Generator().manual_seed(5 * rows + width)
    qw = Int8Weight(torch.randn(width, 96, generator=gen))
    assert qw.w8a8 is None and torch.equal(qw.rowsum, qw.q.sum(1, dtype=torch.int32))  # no second int8 copy
    x = torch.randn(rows, width, generator=gen).to(dtype)
    y = qw(x)
    if rows <= W8A8_MAX_ROWS:
        want = native_ops.int8_unscaled(x, qw.q, qw.rowsum).mul_(qw.native_scale)
        assert torch.equal(y[-1:], qw(x[-1:].clone()))  # the last row alone: the same bits
    else:
        want = (x.bfloat16() @ qw.q.t().bfloat16()).float().mul_(qw.native_scale)
    assert torch.equal(y, want.to(dtype)) and y.dtype == dtype


def test_the_int8_op_passes_torch_library_checks():
    """Schema, fake (meta) implementation and dynamic shapes, as torch.compile will use them.

    opcheck copies every input, and a copy of the W8A8 handle tensor is no handle (fbgemm refuses it,
    loudly): with the pack, the same ground is covered by compiling the op with dynamic rows."""
    qw = Int8Weight(torch.randn(64, 48))
    p = qw.parts()
    for rows in (1, KERNEL_MAX_ROWS + 1):
        x = torch.randn(rows, 64).bfloat16()
        torch.library.opcheck(torch.ops.twopot.int8_matmul.default, (x, p.q, p.scale, None, p.use_kernel),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))  # fmt: skip
    compiled = torch.compile(lambda x: matmul(x, p), fullgraph=True, dynamic=True)
    for rows in (1, 3, W8A8_MAX_ROWS, W8A8_MAX_ROWS + 1, 37):  # both kernels behind one symbolic row count
        x = torch.randn(rows, 64)
        assert torch.equal(compiled(x), matmul(x, p))
    with torch.inference_mode():
        assert torch.equal(compiled(x[:2]), matmul(x[:2], p))
