"""`python -m bench.int8_kernels OUT.json`: torch's int8 weight kernels for one decode row on this CPU.

One row (batch-1 decode), one thread, on the weight shapes of the chef and the 135M shape: float32
`x @ W_t` (our fp32 path), `_weight_int8pack_mm` with bfloat16 activations (our int8 path,
engine/int8_op.py), a bfloat16 `F.linear`, fbgemm's dynamic int8 linear (`quantized.linear_dynamic`:
it quantizes the activations to int8 too, as llama.cpp's q8_0 does) and `_int_mm` (int8 x int8;
it needs at least 32 rows). µs per call, median of 7 repeats. Random weights: speed only.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import timeit

import torch

SHAPES = {"chef up (256->1408)": (256, 1408), "chef head (256->2048)": (256, 2048),
          "135M up (576->3072)": (576, 3072), "135M head (576->49152)": (576, 49152)}  # fmt: skip


def per_call_us(fn, number: int) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def kernels(k: int, n: int) -> dict[str, float]:
    w, x = torch.randn(n, k) * 0.02, torch.randn(1, k)  # (out, in), (1, in)
    number = 2000 if n < 5000 else 100
    scale = w.abs().amax(1) / 127  # (out,) per output channel
    q = torch.round(w / scale[:, None]).to(torch.int8).contiguous()  # (out, in)
    xb, sb, wt, wb = x.to(torch.bfloat16), scale.to(torch.bfloat16), w.t().contiguous(), w.to(torch.bfloat16)
    qw = torch.quantize_per_channel(w, scale, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(qw, None)
    x32 = torch.randint(-127, 127, (32, k), dtype=torch.int8)  # (32, in): _int_mm's least rows
    qt = q.t().contiguous()  # (in, out)
    return {
        "fp32 x @ W_t": per_call_us(lambda: torch.mm(x, wt), number),
        "_weight_int8pack_mm, bf16 x": per_call_us(lambda: torch._weight_int8pack_mm(xb, q, sb), number),
        "bf16 F.linear": per_call_us(lambda: torch.nn.functional.linear(xb, wb), number),
        "quantized.linear_dynamic (int8 activations)": per_call_us(lambda: torch.ops.quantized.linear_dynamic(x, packed), number),
        "_int_mm int8 x int8, 32 rows": per_call_us(lambda: torch._int_mm(x32, qt), number),
    }  # fmt: skip


def main(out: str) -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    report = {"torch": torch.__version__, "threads": 1, "load_average": list(os.getloadavg()),
              "us_per_call": {name: kernels(k, n) for name, (k, n) in SHAPES.items()}}  # fmt: skip
    report["load_average_after"] = list(os.getloadavg())
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    for name, row in report["us_per_call"].items():
        print(name, "  ".join(f"{k} {v:.1f}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "int8-kernels-cpu.json"))
