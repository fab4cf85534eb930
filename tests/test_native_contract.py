"""The contract between Python and the native step (engine/native_contract.h, engine/native_contract.py).

Python's ctypes mirror lays out every struct as the compiler does; a tensor that breaks its row
(dtype, shape, layout) is one EngineError line before any C runs; a buffer whose length is wrong
gets past Python only by building the struct by hand, and then C refuses it with one line naming
it; a model whose tensor breaks the contract cooks op by op and says why.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from engine import Engine, EngineError
from engine import native_contract as contract
from engine.native import NativeStep
from engine.native_build import library
from engine.native_contract import TYPES, Buf
from engine.native_ops import int8_product, product
from engine.serving_core import describe_decode_step

pytestmark = pytest.mark.skipif(isinstance(library(), str), reason="the native step could not be built here")
F32, I8 = TYPES["F32"][0], TYPES["I8"][0]


def test_the_python_mirror_lays_out_every_struct_as_the_compiler_does():
    """twopot_layout: each field's offset and size as the C compiler placed it, from the header's own tables."""
    text = library().twopot_layout().decode().splitlines()
    fields = [line.split() for line in text if not line.startswith("sizeof")]
    assert len(fields) > 60
    for name, offset, size in fields:
        struct, field = name.split(".")
        mirror = getattr(contract.STRUCTS[struct], field)
        assert (mirror.offset, mirror.size) == (int(offset), int(size)), name
    sizes = text[-1].split()[1:]
    for struct, size in zip(sizes[::2], sizes[1::2], strict=True):
        assert ctypes.sizeof(contract.STRUCTS[struct]) == int(size), struct
    c_fields = {n for n, _, _ in fields}
    py_fields = {f"{s}.{f[0]}" for s, cls in contract.STRUCTS.items() for f in cls._fields_}
    assert c_fields == py_fields  # no field only one side knows


def test_a_tensor_that_breaks_its_row_is_one_line_before_any_c_runs():
    x, w = torch.randn(3, 64), torch.randn(64, 10)
    torch.testing.assert_close(product(x, w), x @ w, atol=1e-4, rtol=0)
    cases = {
        "product.w is float64 (64, 10); the contract wants float32 (depth, cols) = (64, 10)": (x, w.double()),
        "product.x is float32 (3, 64) not contiguous": (x.t().contiguous().t(), w),
        "product.w is int8 (10, 63); the contract wants int8 (cols, depth) = (10, 64)": (x, torch.zeros(10, 63, dtype=torch.int8)),
    }  # fmt: skip
    for message, (a, b) in cases.items():
        with pytest.raises(EngineError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
            product(a, b, torch.zeros(b.shape[0], 2).half() if b.dtype == torch.int8 else None)
        assert "\n" not in str(err.value) and str(err.value).startswith("native step: ")
    with pytest.raises(EngineError, match=r"product.scale is missing; the contract wants float16 \(cols, \(depth \+ 31\) / 32\) = \(10, 2\)"):
        product(x, torch.zeros(10, 64, dtype=torch.int8))
    with pytest.raises(EngineError, match=r"product.scale is float16 \(10, 64\); the contract wants float16 \(cols, \(depth \+ 31\) / 32\) = \(10, 2\)"):
        product(x, torch.zeros(10, 64, dtype=torch.int8), torch.ones(10, 64).half())  # a scale per input: not the layout


def test_the_int8_product_checks_its_weight_once_and_the_rows_every_call():
    """The forward's few-row int8 products keep each weight's checked Product; x is checked each call."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (10, 64), dtype=torch.int8, generator=g)
    scale = torch.rand(10, 2, generator=g).half()  # (cols, blocks)
    for rows in (3, 1, 5):  # the same weight, other row counts: the same numbers as the checked-once path
        x = torch.randn(rows, 64, generator=g)
        assert torch.equal(int8_product(x, q, scale), product(x, q, scale))
    with pytest.raises(EngineError, match=r"^native product: x is \(3, 63\); this weight takes \(rows, 64\)$"):
        int8_product(torch.randn(3, 63), q, scale)
    with pytest.raises(EngineError, match=r"product.scale is float32 \(10, 2\); the contract wants float16"):
        int8_product(torch.randn(3, 64), q, scale.float())


def _product_struct(n_w: int, x, w, y, type_w: int = F32) -> contract.Product:
    p = contract.Product(rows=x.shape[0], depth=x.shape[1], cols=y.shape[1], int8=0)
    p.x, p.w, p.y = Buf(x.data_ptr(), x.numel(), F32), Buf(w.data_ptr(), n_w, type_w), Buf(y.data_ptr(), y.numel(), F32)
    return p


def test_the_c_side_refuses_a_wrong_length_with_one_line_and_writes_nothing():
    """Structs built by hand, past Python's checks: C checks every length at its boundary."""
    lib, why = library(), ctypes.create_string_buffer(256)
    x, w = torch.randn(3, 64), torch.randn(64, 10)
    y = torch.full((3, 10), 7.0)
    assert lib.twopot_product(ctypes.byref(_product_struct(639, x, w, y)), why, 256) == 1
    assert why.value.decode() == "product.w: 639 float32 handed, the contract wants 640 float32 (depth, cols)"
    assert lib.twopot_product(ctypes.byref(_product_struct(640, x, w, y, I8)), why, 256) == 1
    assert why.value.decode() == "product.w: 640 int8 handed, the contract wants 640 float32 (depth, cols)"
    missing = _product_struct(640, x, w, y)
    missing.x = Buf(None, 0, 0)
    assert lib.twopot_product(ctypes.byref(missing), why, 256) == 1
    assert why.value.decode() == "product.x is missing: the contract wants float32 (rows, depth)"
    assert torch.equal(y, torch.full((3, 10), 7.0))  # refused before any write
    assert lib.twopot_product(ctypes.byref(_product_struct(640, x, w, y)), why, 256) == 0
    torch.testing.assert_close(y, x @ w, atol=1e-4, rtol=0)


def test_a_pass_with_a_wrong_buffer_is_refused_by_c_and_by_python(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), max_seqs=2)
    step, pool = eng.native, eng.serving.pool
    step(torch.tensor([[1]]), torch.tensor([[0]]), None, pool)  # binds the pool's Pass
    _, _, scratch, _, p, p_ref, _ = step._bind(pool)
    p.scratch = Buf(scratch.data_ptr(), scratch.numel() - 1, F32)
    why = ctypes.create_string_buffer(256)
    assert step.lib.twopot_step(step._struct_ref, p_ref, why, 256) == 1
    assert why.value.decode().startswith(f"pass.scratch: {scratch.numel() - 1} float32 handed, the contract wants {scratch.numel()}")
    p.scratch = Buf(scratch.data_ptr(), scratch.numel(), F32)
    layer = ctypes.cast(p.k.p, ctypes.POINTER(Buf))
    layer[1] = Buf(layer[1].p, layer[1].n - 16, F32)  # one layer's K seats a head short
    with pytest.raises(EngineError, match=r"^native step: pass.k\[1\].seats: \d+ float32 handed, the contract wants"):
        step(torch.tensor([[1]]), torch.tensor([[0]]), None, pool)
    bad = {"int32 tokens": (torch.tensor([[1]], dtype=torch.int32), torch.tensor([[0]])),
           "(1, 2) tokens": (torch.tensor([[1, 2]]), torch.tensor([[0, 1]])),
           "3 rows for 2 seats": (torch.tensor([[1], [2], [3]]), torch.tensor([[0], [0], [0]]))}  # fmt: skip
    fresh = Engine.load(str(tiny_llama.path), max_seqs=2)
    for what, (tok, pos) in bad.items():
        with pytest.raises(EngineError, match=r"a decode step takes int64 \(B, 1\) each, B in 1..2") as err:
            fresh.native(tok, pos, None, fresh.serving.pool)
        assert "\n" not in str(err.value), what
    with pytest.raises(EngineError, match=r"as many positions \(1\) and seats \(2\) as tokens \(2"):
        fresh.native.run([1, 2], [0], [0, 0], [1], fresh.serving.pool)


def test_a_model_whose_tensor_breaks_the_contract_cooks_op_by_op_and_says_why(tiny_llama):
    eng = Engine.load(str(tiny_llama.path), native=False)
    want = eng.generate([[5, 6, 7]], max_new_tokens=4, stop_at_eos=False).tokens[0]
    attn = eng.model.layers[1].attn
    attn.wqkv_t = attn.wqkv_t.t().contiguous().t()  # the same values, laid out (out, in): not what C reads
    step = NativeStep(eng.model)
    assert step.problem.startswith("native step: layers[1].qkv.w is float32 (64, 128) not contiguous; "
                                   "the contract wants float32 (din, dout) = (64, 128)")  # fmt: skip
    assert describe_decode_step(step) == f"op by op: {step.problem}"
    again = Engine(eng.model, eng.codec, eng.info)  # the engine over the changed model: its own native step
    assert again.info.decode_step == f"op by op: {again.native.problem}" == f"op by op: {step.problem}"
    assert again.generate([[5, 6, 7]], max_new_tokens=4, stop_at_eos=False).tokens[0] == want
    assert again.native.steps == 0 and again.native.eager_steps == 3
