"""The native step's products on torch tensors (engine/native_step.c `twopot_product`): the float32
kernel for the bench's ceilings and the tests, and the int8 kernel (W8A8 in 32-wide blocks,
engine/native_int8.h) every int8 product of the model's forward runs on CPU (engine/int8_op.py), so
a row gets the same numbers in every pass, natively or op by op.

Every buffer is checked against the contract (engine/native_contract.h) before C sees it. The int8
product is on the forward's path, a few microseconds a call: there the weight (q and its scales) is
checked once, the first time a thread uses it, and each call checks only the rows x it brings,
setting them into that weight's Product in place; C checks every length on every call.
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import torch

from engine import native_contract as contract
from engine.errors import EngineError
from engine.native_build import library

F32, I8 = contract.TYPES["F32"][0], contract.TYPES["I8"][0]
QBLOCK = 32  # inputs per scale, for int8 weights and activations alike (native_int8.h, engine/quant.py)


def _run(p: contract.Product, why) -> None:
    if library().twopot_product(ctypes.byref(p), why, len(why)) != 0:
        raise EngineError(f"native product: {why.value.decode()}")


def blocks(width: int) -> int:
    """Scale blocks of a row of `width` inputs: ceil(width / 32), the last one may be shorter."""
    return -(-width // QBLOCK)


def prepare_product(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, scale: torch.Tensor | None = None,
                    refine: bool = False):  # fmt: skip
    """y = x @ W, every tensor checked against the contract here, once: returns a function that runs
    it. x (M, K) float32; float32 W (K, N), or int8 q (N, K) with scale (N, ceil(K / 32)) float16:
    W8A8, each 32-wide block of a row of x rounded to 8 bits over its own range, int8 x int8 products
    summed exactly, each block's sum times its two scales (`refine`: x rounded twice, as the LM head's
    input is). y (M, N) float32."""
    int8 = w.dtype == torch.int8
    M, K = x.shape
    N = w.shape[0] if int8 else w.shape[1]
    R = M * (2 if refine else 1)  # rows of x once rounded
    p = contract.Product(rows=M, depth=K, cols=N, int8=int(int8), refine=int(refine))
    tensors = {"x": x, "w": w, "scale": scale, "y": y}
    if int8:  # scratch: the rows rounded to 8 bits, each block's scale
        tensors |= {"xq": torch.empty(R, K, dtype=torch.int8), "sx": torch.empty(R, blocks(K))}
    config = {"rows": M, "depth": K, "cols": N, "int8": int(int8), "refine": int(refine)}
    contract.fill(p, "PRODUCT_BUFFERS", tensors, config, "product.")
    why = ctypes.create_string_buffer(256)

    def run() -> None:
        _run(p, why)

    run.holds = tensors  # what the struct points into lives as long as the function
    return run


def product(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W as a new (M, N) tensor (see `prepare_product`)."""
    y = torch.empty(x.shape[0], w.shape[0] if w.dtype == torch.int8 else w.shape[1])  # (M, N)
    prepare_product(x, w, y, scale)()
    return y


class _Int8Weight:
    """One int8 weight's Product on one thread: q and scale checked once; x, y and the scratch set per call."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor):
        self.q, self.scale, (self.N, self.K) = weakref.ref(q), scale, q.shape
        self.p = contract.Product(depth=self.K, cols=self.N, int8=1)
        contract.fill(self.p, "PRODUCT_BUFFERS", {"w": q, "scale": scale},
                      {"rows": 1, "depth": self.K, "cols": self.N, "int8": 1, "refine": 0}, "product.",
                      partial=True)  # fmt: skip
        self.views = (self.p.x, self.p.y, self.p.xq, self.p.sx)  # the Product's own Bufs, set in place
        for view, kind in zip(self.views, (F32, F32, I8, F32), strict=True):
            view.type = kind
        self.why = ctypes.create_string_buffer(256)


_weights = threading.local()  # each thread's {id(q): _Int8Weight}; an entry leaves with its q


def int8_product(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, refine: bool = False) -> torch.Tensor:
    """x (M, K) -> x @ W^T (M, N) float32, W the int8 weight (q, scale) (see `prepare_product`).
    `refine`: x is rounded to 8 bits twice, as the LM head's input is (engine/int8_op.py)."""
    table = getattr(_weights, "table", None)
    if table is None:
        table = _weights.table = {}
    w = table.get(id(q))
    if w is None or w.q() is not q or w.scale is not scale:
        w = table[id(q)] = _Int8Weight(q, scale)
        weakref.finalize(q, table.pop, id(q), None)
    x = x.float().contiguous()
    if x.dim() != 2 or x.shape[1] != w.K:
        raise EngineError(f"native product: x is {tuple(x.shape)}; this weight takes (rows, {w.K})")
    M, G, R = x.shape[0], blocks(w.K), x.shape[0] * (2 if refine else 1)  # R: rows of x once rounded
    y, xq, sx = torch.empty(M, w.N), torch.empty(R * w.K, dtype=torch.int8), torch.empty(R * G)  # (M, N), scratch
    bx, by, bxq, bsx = w.views
    w.p.rows, w.p.refine = M, int(refine)
    bx.p, by.p, bxq.p, bsx.p = x.data_ptr(), y.data_ptr(), xq.data_ptr(), sx.data_ptr()
    bx.n, by.n, bxq.n, bsx.n = M * w.K, M * w.N, R * w.K, R * G
    _run(w.p, w.why)
    return y
