"""Cases for the native step's C-level driver (tests/native_driver.c), made by this machine's step.

Why: the step must give the same numbers on every CPU it builds for. Here this machine's native
step (x86-64) runs the products (float32 and int8), attention (a decode row and prompt chunks) and
whole passes of tiny models (a prompt pass, then a decode step on two threads; Llama float32 and
int8, GPT-2), and each case's inputs are written to a folder as raw buffers named by the contract
(native_contract.h). A driver built for another CPU or by another compiler runs the same cases
and writes what it got; `compare` holds every result to this machine's.

The tolerance, and why:
- float32 products: |got - want| <= 2 K u (|x| @ |w|), u = 2^-24. Both builds sum each output's K
  terms in the same order (native_vec.h); only where a multiply and an add fuse (FMA) may differ,
  and any such evaluation is within K u sum|x_k w_k| of the exact dot (Higham, Accuracy and Stability
  of Numerical Algorithms, 3.1), so two of them are within twice that.
- int8 products: equal bits. The sums within a 32-wide block are exact integers, and the float
  part has one order and fused multiply-adds on every build (engine/native_int8.h).
- attention, K/V seats and logits (float32 and int8 models): 1e-5 absolute. These values are O(1)
  (under 10 here), so a float32 ulp is at most 1e-6; each differs from x86's by where FMAs fuse
  and by libm's last bit, which measured at most 1.5e-7 over two layers (x86-64-v2, clang and
  aarch64 builds). 1e-5 leaves that 60x room and is 10x tighter than LOGITS_ATOL, the difference
  the suite accepts between the native step and the torch forward (other summation orders). In
  an int8 pass an activation a last bit apart could round to the next 8-bit step (about 1e-3):
  that would fail here, and none does.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import torch
from proc_kit import run

from engine import native_contract as contract
from engine.native_build import library
from engine.native_ops import prepare_product

U = 2.0**-24  # float32's unit roundoff
STEP_ATOL = 1e-5  # float32 passes of the same order on two CPUs (see above)
SUFFIX = {torch.float32: "f32", torch.int8: "i8", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
          torch.float16: "f16"}
BY_TYPE = {code: dtype for code, dtype in contract.TYPES.values() if dtype is not None}


@dataclass
class Case:
    kind: str
    name: str  # its folder under the cases' root
    want: dict[str, torch.Tensor]  # output file stem -> this machine's result
    atol: dict[str, torch.Tensor | float] = field(default_factory=dict)  # per output; absent: equal bits
    line: str = ""  # its line in cases.txt


def _write(folder: Path, name: str, t: torch.Tensor) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    t.contiguous().numpy().tofile(folder / f"{name}.{SUFFIX[t.dtype]}")


def _config(folder: Path, values: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{k} {float(v).hex() if isinstance(v, float) else int(v)}\n" for k, v in values.items())
    (folder / "config.txt").write_text(text)


def product_case(root: Path, name: str, x: torch.Tensor, w: torch.Tensor, scale=None, refine: bool = False) -> Case:
    int8 = w.dtype == torch.int8
    y = torch.empty(x.shape[0], w.shape[0] if int8 else w.shape[1])  # (M, N)
    prepare_product(x, w, y, scale, refine)()
    folder = root / name
    _config(folder, {"rows": x.shape[0], "depth": x.shape[1], "cols": y.shape[1], "int8": int(int8),
                     "refine": int(refine)})  # fmt: skip
    for key, t in {"x": x, "w": w, "scale": scale}.items():
        if t is not None:
            _write(folder, key, t)
    bound = {} if int8 else {"y": 2 * x.shape[1] * U * (x.abs() @ w.abs())}  # (M, N)
    return Case("product", name, {"y": y}, bound, f"product {name}")


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p0: int) -> torch.Tensor:
    """This machine's native attention: q (R, G, D) at positions p0.. against keys, values (p0 + R, D)."""
    R, G, D = q.shape
    out = torch.empty(R, G, D)
    scratch = torch.empty(R * G * (p0 + R) + 16 * D)
    a = contract.Attention(rows=R, p0=p0, G=G, D=D)
    names = {"rows": R, "p0": p0, "G": G, "D": D, "attention_floats": scratch.numel()}
    contract.fill(a, "ATTENTION_BUFFERS", {"q": q, "keys": keys, "values": values, "out": out, "scratch": scratch},
                  names, "attention.")  # fmt: skip
    why = ctypes.create_string_buffer(256)
    assert library().twopot_attention(ctypes.byref(a), why, 256) == 0, why.value.decode()
    return out


def attention_case(root: Path, name: str, q, keys, values, p0: int) -> Case:
    folder = root / name
    R, G, D = q.shape
    _config(folder, {"rows": R, "p0": p0, "G": G, "D": D})
    for key, t in {"q": q, "keys": keys, "values": values}.items():
        _write(folder, key, t)
    return Case("attention", name, {"out": attention(q, keys, values, p0)}, {"out": STEP_ATOL}, f"attention {name}")


def _dump(folder: Path, prefix: str, struct: ctypes.Structure, table: str) -> None:
    """Every buffer of a contract struct, as the C side would read it, to PREFIXFIELD.<type>."""
    for row in contract.rows(table):
        buf = getattr(struct, row.field)
        dtype = BY_TYPE.get(buf.type)
        if buf.p and dtype is not None:
            raw = ctypes.string_at(buf.p, buf.n * dtype.itemsize)
            (folder / f"{prefix}{row.field}.{SUFFIX[dtype]}").write_bytes(raw)


def model_files(root: Path, name: str, step) -> str:
    """The buffers a NativeStep hands to C (its Model struct, walked through the contract's tables)."""
    folder, m = root / name, step.struct
    _config(folder, {**{a[0]: getattr(m, a[0]) for a in contract.tables()["MODEL_CONFIG"]}, "eps": float(m.eps)})
    _dump(folder, "", m, "MODEL_BUFFERS")
    _dump(folder, "lm_head.", m.lm_head, "LINEAR_BUFFERS")
    layers = (contract.Layer * m.n_layers).from_address(m.layers.p)
    for i, layer in enumerate(layers):
        _dump(folder, f"layers.{i}.", layer, "LAYER_BUFFERS")
        for lin in contract.tables()["LAYER_LINEARS"]:
            _dump(folder, f"layers.{i}.{lin[0]}.", getattr(layer, lin[0]), "LINEAR_BUFFERS")
    return name


def step_case(root: Path, name: str, model: str, step, pool, rows: dict[str, list[int]], threads: int) -> Case:
    """One pass of `step` over `pool` (rows: tok, pos, seat, out): its inputs and the seats before
    it to the case's folder; what this machine's step gave (logits, the seats after) as the want."""
    folder = root / name
    B = len(rows["tok"])
    _config(folder, {"rows": B, "n_out": len(rows["out"]), "seats": pool.seats, "seat_len": pool.seat_len,
                     "cap": step.group, "threads": threads})  # fmt: skip
    for key in ("tok", "pos", "seat", "out"):
        _write(folder, key, torch.tensor(rows[key], dtype=torch.int64))
    for i, (k, v) in enumerate(zip(pool.k_layer, pool.v_layer, strict=True)):
        _write(folder, f"k.{i}", k)
        _write(folder, f"v.{i}", v)
    want = {"logits": step.run(rows["tok"], rows["pos"], rows["seat"], rows["out"], pool)}
    want |= {f"k.{i}": k.clone() for i, k in enumerate(pool.k_layer)} | {f"v.{i}": v.clone() for i, v in enumerate(pool.v_layer)}
    return Case("step", name, want, dict.fromkeys(want, STEP_ATOL), f"step {model} {name}")


def write_cases(root: Path, cases: list[Case]) -> None:
    (root / "cases.txt").write_text("".join(c.line + "\n" for c in cases))


def run_driver(command: list[str], root: Path) -> str:
    """Run a built driver over the cases (command: the program, or qemu and the program); its stdout."""
    return run([*command, str(root)], timeout=600).stdout.strip()


def compare(root: Path, cases: list[Case]) -> dict[str, float]:
    """Every driver output against this machine's; the largest difference of each case, for the report."""
    worst = {}
    for case in cases:
        for stem, want in case.want.items():
            got = torch.from_file(str(root / case.name / f"{stem}.out"), size=want.numel(), dtype=torch.float32)
            got = got.view(want.shape)
            diff = (got - want).abs()
            worst[f"{case.name}/{stem}"] = diff.max().item()
            tol = case.atol.get(stem)
            if tol is None:
                assert torch.equal(got, want), f"{case.name}/{stem}: not the same bits (largest difference {diff.max()})"
            else:
                over = diff > tol
                assert not over.any(), (f"{case.name}/{stem}: {int(over.sum())} values differ by more than the "
                                        f"tolerance (largest {diff.max():.3g})")  # fmt: skip
    return worst
