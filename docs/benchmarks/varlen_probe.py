"""Packed prefill attention, one layer, every candidate on the same tensors (docs/benchmarks/varlen-cpu.md).

The Prep standard lab's batch (8 prompts: 8, 16, 24, 40, 64, 96, 160, 256 tokens; N = 664) with the
chef's heads (8 query, 4 KV, head dim 32) and the SmolLM2-135M shape's (9, 3, 64):

  loop      one SDPA call per sequence (engine/model.py on CPU)
  one_call  one SDPA call over all N tokens with the block-diagonal causal mask (engine/model.py on CUDA)
  flex      FlexAttention with the same document mask as a block mask, eager; `--compile` adds
            the torch.compile'd version (needs a C++ compiler on CPU; the compile is timed apart)
  njt       SDPA over nested jagged tensors (reported as an error where no backend takes them)
  padded    what the padded batch runs: (8, H, 256, D) with its (8, 1, 256, 256) mask

Every candidate runs once per round, rounds interleaved; medians of 9 rounds after a warm-up.

    .venv/bin/python docs/benchmarks/varlen_probe.py [--compile]
"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

LENGTHS = [8, 16, 24, 40, 64, 96, 160, 256]
SHAPES = {"chef": (8, 4, 32), "smollm2-135m": (9, 3, 64)}


def candidates(h: int, hkv: int, d: int, compile_flex: bool) -> dict:
    n = sum(LENGTHS)
    q, k, v = torch.randn(1, h, n, d), torch.randn(1, hkv, n, d), torch.randn(1, hkv, n, d)
    doc = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))  # (N,)
    pos = torch.arange(n)
    mask = (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])  # (N, N)
    block = create_block_mask(lambda b, hh, i, j: (doc[i] == doc[j]) & (i >= j), None, None, n, n, device="cpu")
    offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    b, longest = len(LENGTHS), max(LENGTHS)
    qp, kp, vp = torch.randn(b, h, longest, d), torch.randn(b, hkv, longest, d), torch.randn(b, hkv, longest, d)
    pmask = torch.ones(b, 1, longest, longest, dtype=torch.bool).tril()

    def loop():
        outs, s = [], 0
        for m in LENGTHS:
            sl = slice(s, s + m)
            outs.append(F.scaled_dot_product_attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], is_causal=True,
                                                       enable_gqa=True))  # fmt: skip
            s += m
        return torch.cat(outs, dim=2)

    def njt():
        def nested(x):  # (1, Hx, N, D) -> jagged (B, j, Hx, D) -> (B, Hx, j, D)
            return torch.nested.nested_tensor_from_jagged(x[0].transpose(0, 1).contiguous(), offsets).transpose(1, 2)

        g = h // hkv
        return F.scaled_dot_product_attention(nested(q), nested(k.repeat_interleave(g, 1)),
                                              nested(v.repeat_interleave(g, 1)), is_causal=True)  # fmt: skip

    out = {
        "loop": loop,
        "one_call": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        "flex": lambda: flex_attention(q, k, v, block_mask=block, enable_gqa=True),
        "njt": njt,
        "padded": lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=pmask, enable_gqa=True),
    }
    if compile_flex:
        compiled = torch.compile(flex_attention, dynamic=False)
        t0 = time.perf_counter()
        compiled(q, k, v, block_mask=block, enable_gqa=True)
        print(f"flex compile: {time.perf_counter() - t0:.1f} s")
        out["flex_compiled"] = lambda: compiled(q, k, v, block_mask=block, enable_gqa=True)
    return out


def main() -> None:
    torch.set_num_threads(2)
    for name, shape in SHAPES.items():
        fns = candidates(*shape, compile_flex="--compile" in sys.argv)
        times = {}
        for key, fn in list(fns.items()):
            try:
                fn()
                times[key] = []
            except Exception as err:  # noqa: BLE001 - a probe reports what does not run
                print(f"{name} {key}: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
        for _ in range(9):
            for key in times:
                t0 = time.perf_counter()
                fns[key]()
                times[key].append(time.perf_counter() - t0)
        row = ", ".join(f"{k} {statistics.median(v) * 1e3:.2f}" for k, v in times.items())
        print(f"{name} {shape}, N = {sum(LENGTHS)}: ms per layer: {row}")


if __name__ == "__main__":
    main()
