"""The Python side of the native step's contract (engine/native_contract.h): which buffers a call
hands to C, their dtypes and shapes, read from the header's own tables.

Why read the header: the structs ctypes builds here and the checks made before a call come from
the same rows the C side checks lengths with, so the two cannot drift apart unnoticed (a test
holds this mirror's layout to the compiler's: tests/test_native_contract.py).

A row X(field, type, need, dim, ...) reads: `field` is a `type` tensor of shape (dim, ...) when
`need` holds; e.g. `X(wpe, F32, !rope, max_context, d)` is GPT-2's learned positions, float32
(max_context, d), handed only when the model has no RoPE. `check` raises one EngineError line
naming the first tensor that breaks its row, before any C runs.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import EngineError

HEADER = Path(__file__).with_name("native_contract.h")
TYPES = {"F32": (1, torch.float32), "I8": (2, torch.int8), "I32": (3, torch.int32), "I64": (4, torch.int64),
         "U8": (5, torch.uint8), "BUF": (6, None), "LAYER": (7, None), "F16": (8, torch.float16)}  # fmt: skip
OPT = "OPT"


@dataclass(frozen=True)
class Row:
    field: str
    type: str  # a TYPES key
    need: str  # "1", "OPT", "flag" or "!flag"
    dims: tuple[str, ...]  # expressions of config names: "d", "(gated + 1) * ffn"

    @property
    def dtype(self) -> torch.dtype | None:
        return TYPES[self.type][1]


def _calls(body: str, letter: str) -> list[list[str]]:
    """The argument lists of every `letter(...)` in a macro body, split at top-level commas."""
    out, i = [], 0
    while (i := body.find(letter + "(", i)) >= 0:
        if i and (body[i - 1].isalnum() or body[i - 1] == "_"):
            i += 1
            continue
        depth, j, args, start = 0, i + 1, [], i + 2
        while True:
            c = body[j]
            depth += c == "("
            depth -= c == ")"
            if depth == 1 and c == ",":
                args.append(body[start:j].strip())
                start = j + 1
            if depth == 0:
                args.append(body[start:j].strip())
                break
            j += 1
        out.append(args)
        i = j
    return out


@functools.lru_cache(maxsize=1)
def tables() -> dict[str, list[list[str]]]:
    """Every TWOPOT_<NAME>(X) table of the header: NAME -> its rows' arguments."""
    text = HEADER.read_text()
    found = {}
    for m in re.finditer(r"#define TWOPOT_(\w+)\((\w)\)((?:[^\n]*\\\n)*[^\n]*)", text):
        name, letter, body = m.groups()
        found[name] = _calls(body.replace("\\\n", " "), letter)
    return found


def rows(table: str) -> list[Row]:
    return [Row(a[0], a[1], a[2], tuple(a[3:])) for a in tables()[table]]


def evaluate(expr: str, names: dict[str, int]) -> int:
    """A dimension or need of the header: integers, config names, + - * /, parentheses; `!x` is not x.
    `/` is C's integer division (the dimensions are never negative): "(din + 31) / 32" of 576 is 18."""
    return _compiled(expr)(names)


@functools.cache
def _compiled(expr: str):
    if expr.startswith("!"):
        inner = _compiled(expr[1:])
        return lambda names: int(not inner(names))

    def walk(node: ast.AST):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return lambda names: node.value
        if isinstance(node, ast.Name):
            return lambda names: names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            op, left, right = OPS[type(node.op)], walk(node.left), walk(node.right)
            return lambda names: op(left(names), right(names))
        raise ValueError(f"not a contract expression: {expr}")

    return walk(ast.parse(expr, mode="eval").body)


OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
       ast.Div: lambda a, b: a // b}


def dims(config: dict[str, int]) -> dict[str, int]:
    """The config's names plus the header's derived dimensions (TWOPOT_DIMS)."""
    names = dict(config)
    for name, expr in tables()["DIMS"]:
        names[name] = evaluate(expr, names)
    return names


# ---- the ctypes mirror, built from the tables in the header's field order ----------------------
class Buf(ctypes.Structure):
    _fields_ = [("p", ctypes.c_void_p), ("n", ctypes.c_int64), ("type", ctypes.c_int32)]


def _struct(name: str, prefix: str, linear=None) -> type[ctypes.Structure]:
    t = tables()
    fields = [(a[0], ctypes.c_int) for a in t.get(prefix + "_CONFIG", [])]
    fields += [(a[0], ctypes.c_float) for a in t.get(prefix + "_REALS", [])]
    for a in t.get(prefix + "_BUFFERS", []):
        if a[0] not in [f for f, _ in fields]:
            fields.append((a[0], Buf))
    fields += [(a[0], linear) for a in t.get(prefix + "_LINEARS", [])]
    return type(name, (ctypes.Structure,), {"_fields_": fields})


Linear = _struct("Linear", "LINEAR")
Layer = _struct("Layer", "LAYER", Linear)
Model = _struct("Model", "MODEL", Linear)
Pass = _struct("Pass", "PASS")
Product = _struct("Product", "PRODUCT")
Attention = _struct("Attention", "ATTENTION")
STRUCTS = {"Buf": Buf, "Linear": Linear, "Layer": Layer, "Model": Model, "Pass": Pass, "Product": Product,
           "Attention": Attention}  # fmt: skip


# ---- checks: one EngineError line naming the tensor, before any C runs --------------------------
def needed(row: Row, names: dict[str, int]) -> bool | None:
    """True: must be handed; None: may be handed (OPT); False: not read."""
    return None if row.need == OPT else bool(evaluate(row.need, names))


def check(where: str, row: Row, t: torch.Tensor | None, names: dict[str, int]) -> Buf:
    """The Buf of `t` for `row`, after checking its dtype, shape and layout against the row."""
    need = needed(row, names)
    if need is False or (need is None and t is None):
        return Buf(None, 0, 0)
    shape = tuple(evaluate(d, names) for d in row.dims)
    want = f"{row.dtype} ({', '.join(row.dims)}) = {shape}".replace("torch.", "")
    if t is None:
        raise EngineError(f"native step: {where}{row.field} is missing; the contract wants {want}")
    if t.dtype != row.dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.device.type != "cpu":
        got = f"{t.dtype} {tuple(t.shape)}{'' if t.is_contiguous() else ' not contiguous'}"
        got += "" if t.device.type == "cpu" else f" on {t.device.type}"
        raise EngineError(f"native step: {where}{row.field} is {got.replace('torch.', '')}; the contract wants {want}")
    return Buf(t.data_ptr(), t.numel(), TYPES[row.type][0])


def fill(struct: ctypes.Structure, table: str, tensors: dict[str, torch.Tensor | Buf | None], names: dict[str, int],
         where: str = "", partial: bool = False, keep: list | None = None) -> None:  # fmt: skip
    """Check and set every buffer of `table` from `tensors` (by field name); rows not needed stay
    empty. `partial`: only the fields in `tensors` (a Pass's fixed ones, made once per pool).
    `keep`: collects the tensors pointed to, so their memory lives as long as the struct's owner."""
    for row in rows(table):
        if partial and row.field not in tensors:
            continue
        t = tensors.get(row.field)
        if isinstance(t, Buf):  # an array of structs or of Bufs (the layers, each layer's seats): made here
            setattr(struct, row.field, t)
            continue
        buf = check(where, row, t, names)
        if buf.p is not None or needed(row, names) is not False:
            setattr(struct, row.field, buf)
        if buf.p is not None and keep is not None:
            keep.append(t)
