"""The int8 LM head's refinement (engine/int8_op.py, native_refine.h).

Why it is tested apart: the LM head's rounding error lands on the logits directly, so its input is
rounded to 8 bits, then what that missed is rounded to 8 bits too, and each row's REFINE_TOP largest
outputs get the remainder's product added. Bound, stated before the numbers: after the first
rounding an input is off by at most half a step of its block (r_g / 254); the second rounding, over
the remainder's own range, leaves at most half a step of the remainder's block (its max / 254), so
a refined output is within that, times the weights it meets, of the dequantized weight's float64
product; every other output is the once-rounded product, bit for bit.
"""

import pytest
import torch

from engine import Engine, EngineError, native_build, native_ops
from engine.int8_op import REFINE_TOP, emulated_product, round_blocks
from engine.native import unsupported
from engine.quant import Int8Weight

NATIVE = native_build.ready()  # the engine's own int8 kernel is built here (else the torch emulation serves)


def _half_steps(x: torch.Tensor) -> torch.Tensor:
    """(M, K) each input's half 8-bit step: its 32-wide block's max |x| / 254."""
    M, K = x.shape
    G = -(-K // 32)
    xb = torch.nn.functional.pad(x.double().abs(), (0, G * 32 - K)).view(M, G, 32)  # (M, G, 32)
    return (xb.amax(-1) / 254).repeat_interleave(32, 1)[:, :K]  # (M, K)


def _case(rows: int, width: int, seed: int, out: int = 96) -> tuple[Int8Weight, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    qw = Int8Weight(torch.randn(width, out, generator=gen), refine=True)  # (in, out) float -> int8
    x = torch.randn(rows, width, generator=gen)
    x[:, 5] *= 100.0  # an outlier feature, as the LM head's input has
    return qw, x, qw.dequantized().t().double()  # deq (out, in)


@pytest.mark.parametrize("width", [64, 40, 200])  # 40: a short last block; 200: six whole and a short one
@pytest.mark.parametrize("rows", [1, 3, 5, 9])  # across the kernel's 4-row groups
def test_a_twice_rounded_input_is_within_the_second_roundings_bound(rows, width):
    """Fewer outputs than REFINE_TOP: every one is refined."""
    out = REFINE_TOP // 2 + 3
    qw, x, deq = _case(rows, width, 7 * rows + width, out=out)
    y = qw(x)
    assert y.shape == (rows, out) and y.dtype == torch.float32
    exact = x.double() @ deq.t()  # (M, out)
    remainder = x - round_blocks(x)  # what the first rounding missed
    bound = _half_steps(remainder) @ deq.abs().t() * (1 + 1e-5) + 1e-4  # float32's own sums' slack
    err = (y.double() - exact).abs()
    assert (err <= bound).all()
    err_once = (_once(qw)(x).double() - exact).abs()
    assert err.max() * 50 < err_once.max()  # about 16 bits against 8


def _once(qw: Int8Weight) -> Int8Weight:
    """The same int8 weight, its input rounded once."""
    once = Int8Weight(torch.zeros(1, 1))
    once.q, once.scale, once.in_features, once.out_features = qw.q, qw.scale, qw.in_features, qw.out_features
    return once


@pytest.mark.parametrize("rows", [1, 6])
def test_only_each_rows_largest_outputs_are_refined(rows):
    """Past REFINE_TOP outputs, a row's largest (of the once-rounded product) are refined and within
    the second rounding's bound; every other output is the once-rounded product, bit for bit."""
    qw, x, deq = _case(rows, 64, 11 * rows, out=REFINE_TOP + 190)
    y, once = qw(x), _once(qw)(x)
    top = torch.zeros_like(y, dtype=torch.bool).scatter_(1, once.topk(REFINE_TOP, dim=1).indices, True)
    assert torch.equal(y[~top], once[~top]) and not torch.equal(y[top], once[top])
    bound = _half_steps(x - round_blocks(x)) @ deq.abs().t() * (1 + 1e-5) + 1e-4  # (M, out)
    assert ((y.double() - x.double() @ deq.t()).abs()[top] <= bound[top]).all()


def test_ties_at_the_edge_go_to_the_lower_index():
    """Identical weight rows give identical outputs: the lower REFINE_TOP indices are the refined ones,
    natively and in the torch emulation alike."""
    gen = torch.Generator().manual_seed(2)
    row = torch.randn(64, 1, generator=gen)
    qw = Int8Weight(row.expand(64, REFINE_TOP + 40).contiguous(), refine=True)
    x = torch.randn(2, 64, generator=gen)
    for y, once in ((qw(x), _once(qw)(x)), (emulated_product(x, qw.q, qw.scale, True), emulated_product(x, qw.q, qw.scale))):
        assert (once == once[:, :1]).all()  # the premise: every output the same
        assert torch.equal(y[:, REFINE_TOP:], once[:, REFINE_TOP:])
        assert (y[:, :REFINE_TOP] != once[:, :REFINE_TOP]).all()
        assert (y[:, :REFINE_TOP] == y[:, :1]).all()  # the same refinement for each identical row


@pytest.mark.parametrize("rows", [1, 4, 7])
def test_the_native_product_and_the_torch_emulation_agree(rows):
    """The same rule, summed in another order: within float32's summation bound of each other."""
    if not NATIVE:
        pytest.skip("the engine's own kernels could not be built here")
    qw, x, deq = _case(rows, 200, rows, out=REFINE_TOP + 60)
    native = native_ops.int8_product(x, qw.q, qw.scale, refine=True)
    emulated = emulated_product(x, qw.q, qw.scale, refine=True)
    slack = 2 * 200 * 2**-24 * (x.double().abs() @ deq.abs().t())  # two float32 sums of 200 terms, any order
    assert ((native.double() - emulated.double()).abs() <= slack).all()


def test_a_row_is_the_same_bits_alone_or_among_others():
    """A row's refinement depends on its own outputs alone, so a decode row's logits are the same
    bits alone or beside others."""
    if not NATIVE:
        pytest.skip("the engine's own kernels could not be built here")
    qw, x, _ = _case(11, 200, 3, out=REFINE_TOP + 60)
    x[0] *= 1000.0
    y = qw(x)
    for m in range(11):
        assert torch.equal(y[m : m + 1], qw(x[m : m + 1].clone()))


def test_a_scratch_too_short_for_two_roundings_is_refused_in_one_line():
    """C checks every length at the boundary: a refined product needs 2 rows of scratch per row of x."""
    if not NATIVE:
        pytest.skip("the engine's own kernels could not be built here")
    qw, x, _ = _case(3, 64, 1)
    w = native_ops._Int8Weight(qw.q, qw.scale)
    y, xq, sx = torch.empty(3, 96), torch.empty(3 * 64, dtype=torch.int8), torch.empty(3 * 2)  # once-rounded sizes
    bx, by, bxq, bsx = w.views
    w.p.rows, w.p.refine = 3, 1
    bx.p, by.p, bxq.p, bsx.p = x.data_ptr(), y.data_ptr(), xq.data_ptr(), sx.data_ptr()
    bx.n, by.n, bxq.n, bsx.n = 3 * 64, 3 * 96, 3 * 64, 3 * 2
    with pytest.raises(EngineError) as err:
        native_ops._run(w.p, w.why)
    assert "xq" in str(err.value) and "\n" not in str(err.value)


def test_only_the_lm_head_is_rounded_twice(tiny_llama):
    """A quantized model's LM head refines its input and no other product does (tests/test_native.py
    holds the native step's int8 tokens and logits to the op-by-op forward's)."""
    model = Engine.load(str(tiny_llama.path), quant="int8").model
    assert [m for m in model.modules() if isinstance(m, Int8Weight) and m.refine] == [model.lm_head_t]


def test_the_native_step_refuses_an_lm_head_rounded_once_in_one_line(tiny_llama):
    """The native step rounds its LM head's input twice: a model whose head does otherwise would get
    other logits natively than op by op, so the step refuses it and the forward serves."""
    if not NATIVE:
        pytest.skip("the engine's own kernels could not be built here")
    model = Engine.load(str(tiny_llama.path), quant="int8").model
    assert unsupported(model) is None
    model.lm_head_t.refine = False
    assert unsupported(model) == "the native step rounds the int8 LM head's input twice and every other product's once"
