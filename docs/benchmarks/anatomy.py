"""Anatomy of one forward pass: our engine's pass vs its weight matmuls alone vs HF's pass.

The evidence behind results-cpu.md's recommendations. For each phase it times, interleaved and
repeated (min and median), three things on the SAME saved weights:
  ours      our Transformer's forward (decode: one token per sequence against a filled KV cache)
  matmuls   only the weight matmuls that forward does (x @ W_t per matrix, plus alternatives)
  hf        transformers' forward for the same shape (its default DynamicCache)
so "ours - matmuls" is the per-pass overhead (norms, RoPE, attention, Python) and "matmuls" is the
part only bandwidth or FLOP/s can speed up.

    PYTHONPATH=. .venv/bin/python docs/benchmarks/anatomy.py --threads 1 --reps 25
"""
# ruff: noqa: E402

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # what `import engine` does, before torch starts

import argparse
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from engine import Engine
from engine.bench.contestants import reference_folder
from engine.kv_pool import SeatPool


def timed(fns: dict, reps: int) -> dict:
    """Interleave the candidates rep by rep, so load spikes hit them alike; keep min and median."""
    for fn in fns.values():
        fn()
    samples = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t0)
    return {k: (min(v), statistics.median(v)) for k, v in samples.items()}


def decode_candidates(eng, hf, batch: int, kv_len: int) -> dict:
    m, cfg = eng.model, eng.cfg
    cache = SeatPool(cfg, batch, kv_len + 1, m.dtype, m.device)
    tok = torch.full((batch, 1), 5)  # (B, 1)
    pos = torch.full((batch, 1), kv_len)  # (B, 1)
    slot = torch.tensor([kv_len])
    mask = torch.ones(batch, 1, 1, kv_len + 1, dtype=torch.bool)  # (B, 1, 1, S)
    mats = [w for b in m.layers for w in (b.attn.wqkv_t, b.attn.wo_t, b.mlp.w_up_t, b.mlp.w_down_t)]
    mats.append(m.lm_head_t)  # (in, out) each
    mats_out_in = [w.t().contiguous() for w in mats]  # (out, in): HF's layout
    xs = {n: torch.randn(batch, n) for n in {w.shape[0] for w in mats}}  # (B, in)
    xts = {n: x.t().contiguous() for n, x in xs.items()}  # (in, B)

    ids = torch.randint(3, cfg.vocab_size, (batch, kv_len))
    hcache = DynamicCache(config=hf.config)
    hf(ids, past_key_values=hcache, use_cache=True, logits_to_keep=1)

    def hf_step():
        hf(tok, past_key_values=hcache, use_cache=True, position_ids=pos, logits_to_keep=1)
        hcache.crop(-1)  # back to kv_len cached tokens, like our fixed slot

    return {
        "ours: forward": lambda: m(tok, pos, slot, mask, cache),
        "matmuls: x @ W_t (ours)": lambda: [xs[w.shape[0]] @ w for w in mats],
        "matmuls: W @ x^T (weights left)": lambda: [w @ xts[w.shape[1]] for w in mats_out_in],
        "hf: forward": hf_step,
    }


def prefill_candidates(eng, hf, tokens: int) -> dict:
    from engine import prefill  # lazy: a probe script: the engine loads after its argument parsing
    from engine.batching import build_batch  # lazy: as above

    m, cfg = eng.model, eng.cfg
    prompt = torch.randint(3, cfg.vocab_size, (1, tokens)).tolist()
    batch = build_batch(prompt, "padded", m.device, tokens)
    mats = [w for b in m.layers for w in (b.attn.wqkv_t, b.attn.wo_t, b.mlp.w_up_t, b.mlp.w_down_t)]
    xs = {n: torch.randn(tokens, n) for n in {w.shape[0] for w in mats}}  # (T, in)
    ids = torch.tensor(prompt)

    def ours():
        cache = SeatPool(cfg, 1, tokens, m.dtype, m.device)
        prefill(m, batch, cache)

    return {
        "ours: prefill forward": ours,
        "matmuls: layer GEMMs alone": lambda: [xs[w.shape[0]] @ w for w in mats],
        "hf: forward (last logits)": lambda: hf(ids, use_cache=True, logits_to_keep=1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="preset:smollm2-135m")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--kv", type=int, default=128, help="cached tokens per sequence during decode")
    p.add_argument("--prefill", type=int, default=512)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        folder = reference_folder(args.model, tmp)
        eng = Engine.load(folder)
        hf = AutoModelForCausalLM.from_pretrained(folder).eval()
        weight_bytes = eng.info.weight_bytes
        print(f"{args.model}, {args.threads} thread(s), {args.reps} interleaved reps; ms (min / median)")
        for batch in (1, 4, 32):
            for k, (mn, med) in timed(decode_candidates(eng, hf, batch, args.kv), args.reps).items():
                gbs = weight_bytes / mn / 1e9
                print(
                    f"decode b{batch:<3d} {k:34s} {mn * 1e3:8.1f} / {med * 1e3:8.1f}   ({gbs:5.1f} GB/s of weights)"
                )
        flops = (
            2
            * args.prefill
            * sum(
                w.numel()
                for b in eng.model.layers
                for w in (b.attn.wqkv_t, b.attn.wo_t, b.mlp.w_up_t, b.mlp.w_down_t)
            )
        )
        for k, (mn, med) in timed(prefill_candidates(eng, hf, args.prefill), max(3, args.reps // 5)).items():
            print(
                f"prefill {args.prefill} {k:32s} {mn * 1e3:8.1f} / {med * 1e3:8.1f}   (layer GEMMs {flops / mn / 1e9:5.0f} GFLOP/s)"
            )


if __name__ == "__main__":
    main()
