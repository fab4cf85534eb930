"""`python -m engine.bench.int8_kernels OUT.json`: torch's int8 products over a whole model's weights, on this CPU.

Rows 1 to 256 (`ROWS`), one thread, every matmul weight of the chef and of the SmolLM2-135M
shape (random values of the real shapes), each product run once per weight in call order, as a
decode step reads them: ms per chain, median of `REPEATS`. Candidates:
  * float32 `x @ W_t` (our fp32 path); W8A16: `_weight_int8pack_mm` with bfloat16 activations (the
    int8 path's decode kernel where W8A8 is missing) and the int8 weight widened to bfloat16 for
    torch's bf16 GEMM (its many-rows kernel);
  * W8A8 dynamic, int32 sums: fbgemm's `fbgemm_linear_int8_weight_fp32_activation` (tensor
    arguments, engine/int8_op.py) with the rows scaled to a common range first (per-row precision)
    or as they come (one range for all rows); fbgemm's `quantized.linear_dynamic` (a packed
    ScriptObject, one range for all rows); oneDNN's `qlinear_pointwise` on per-row int8
    activations (the op inductor's x86 quantizer emits).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings

import torch

from engine.config import config_from_hf
from engine.int8_op import pack_w8a8, w8a8_product
from engine.loader import EMBEDDED_MODELS
from engine.presets import preset_config

ROWS = (1, 4, 8, 16, 64, 128, 256)  # decode batches, and where the widened kernel takes over
REPEATS = 5
CHEF = EMBEDDED_MODELS / "chef" / "config.json"


def model_shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of every matmul weight in call order: q|k|v, out, gate|up, down per layer, then the head."""
    d, up = cfg.d_model, (2 if cfg.mlp_gated else 1) * cfg.ffn_dim
    layer = [(d, cfg.q_dim + 2 * cfg.kv_dim), (cfg.q_dim, d), (d, up), (cfg.ffn_dim, d)]
    return layer * cfg.n_layers + [(d, cfg.vocab_size)]


def _onednn(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor) -> torch.Tensor:
    rs = x.abs().amax(1, keepdim=True).clamp_(min=1e-30) / 127  # (M, 1) per-row activation scale
    xq = torch.round(x / rs).to(torch.int8)  # (M, in)
    y = torch.ops.onednn.qlinear_pointwise(xq, 1.0, 0, packed, scale, zp, None, 1.0, 0, torch.float32, "none", [], "")
    return y * rs  # (M, out)


def candidates(k: int, n: int) -> dict:
    """name -> function of x (M, in) float32 for one random weight of shape (in, out)."""
    w = torch.randn(n, k) * 0.02  # (out, in)
    scale = (w.abs().amax(1) / 127).bfloat16()  # (out,) per output channel, as engine/quant.py rounds it
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()  # (out, in)
    wt, s32, zp = w.t().contiguous(), scale.float(), torch.zeros(n, dtype=torch.long)
    w8 = pack_w8a8(q, scale)
    fb = (q, w8.packed, w8.col_offsets, 1.0, 0, w8.zero_bias)
    qw = torch.quantize_per_channel(q.float() * s32[:, None], s32, zp, 0, torch.qint8)
    dyn = torch.ops.quantized.linear_prepack(qw, None)
    dnn = torch.ops.onednn.qlinear_prepack(q, None)
    return {
        "fp32 x @ W_t": lambda x: x @ wt,
        "W8A16 _weight_int8pack_mm": lambda x: torch._weight_int8pack_mm(x.bfloat16(), q, scale),
        "W8A16 widened to bf16, bf16 GEMM": lambda x: (x.bfloat16() @ q.t().bfloat16()).mul_(scale),
        "W8A8 fbgemm, per-row range": lambda x: w8a8_product(x, q, w8),
        "W8A8 fbgemm, one range": lambda x: torch.fbgemm_linear_int8_weight_fp32_activation(x, *fb) * s32,
        "W8A8 quantized.linear_dynamic, one range": lambda x: torch.ops.quantized.linear_dynamic(x, dyn),
        "W8A8 onednn qlinear, per-row": lambda x: _onednn(x, dnn, s32, zp),
    }  # fmt: skip


def chain_ms(fns: list, rows: int, k_of: list[int]) -> float:
    xs = {k: torch.randn(rows, k) for k in set(k_of)}  # one (rows, in) activation per input width
    times = []
    for i in range(REPEATS + 1):
        t0 = time.perf_counter()
        for fn, k in zip(fns, k_of, strict=True):
            fn(xs[k])
        if i:  # the first pass warms up (oneDNN builds its primitives then)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(cfg) -> dict:
    shapes = model_shapes(cfg)
    per_weight = [candidates(k, n) for k, n in shapes]
    k_of = [k for k, _ in shapes]
    return {f"{rows} rows": {name: chain_ms([c[name] for c in per_weight], rows, k_of) for name in per_weight[0]}
            for rows in ROWS}  # fmt: skip


def main(out: str) -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", message=".*deprecated.*")  # the quantized-tensor API warns once per call site
    models = {"chef": config_from_hf(json.loads(CHEF.read_text())), "smollm2-135m": preset_config("smollm2-135m")}
    report = {"torch": torch.__version__, "threads": 1, "repeats": REPEATS, "load_average": list(os.getloadavg())}
    report["ms_per_chain"] = {name: measure(cfg) for name, cfg in models.items()}
    report["load_average_after"] = list(os.getloadavg())
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    for model, by_rows in report["ms_per_chain"].items():
        for rows, row in by_rows.items():
            print(model, rows, "  ".join(f"{k} {v:.2f}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "int8-kernels-cpu.json"))
