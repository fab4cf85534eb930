"""The main bench's scenarios: prefill (TTFT), decode at one batch size (TPOT), and a per-op profile.

Each alternates HF and ours (engine/bench/contestants.py `alternate`) so neighbours' noise hits both alike.
"""

from __future__ import annotations

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from engine import decode_one_token, prefill
from engine.batching import build_batch
from engine.bench.contestants import (
    Contestants,
    Samples,
    alternate,
    common_prefix,
    random_prompts,
    run_hf,
    run_ours,
)
from engine.bench.plan import BenchPlan
from engine.bench.roofline import synchronize
from engine.kv_pool import SeatPool


def measure_prefill(c: Contestants, plan: BenchPlan, dev: torch.device, progress) -> dict:
    """TTFT of B prompts of P tokens (B = plan.prefill_batch): the wok's one parallel pass, then one token each."""
    prompt = random_prompts(c.vocab_size, plan.prefill_batch, plan.prefill_tokens, seed=1)  # (B, P) ids
    hf_ttft, ours_ttft, ours_wall, ours_prefill = Samples(), Samples(), Samples(), Samples()
    flops = 0.0
    for i in range(plan.warmup + plan.repeats):
        progress(f"prefill {plan.prefill_batch} x {plan.prefill_tokens} tokens: run {i + 1}/{plan.warmup + plan.repeats}")
        timed = i >= plan.warmup
        hf, ours = alternate(i, lambda: run_hf(c.hf, prompt, 1, dev), lambda: run_ours(c.engine, prompt, 1, dev))
        res = ours.result
        if timed:
            hf_ttft.values.append(hf.ttft_s)
            ours_wall.values.append(ours.ttft_s)
            ours_ttft.values.append(res.metrics.ttft_s)
            ours_prefill.values.append(res.metrics.prefill_s)
            flops = res.trace.prefill.flops
    return {
        "prompt_tokens": plan.prefill_tokens,
        "prompt_batch": plan.prefill_batch,
        "hf": {"ttft_s": hf_ttft.to_dict()},
        "ours": {
            "ttft_s": ours_ttft.to_dict(),
            "prefill_s": ours_prefill.to_dict(),
            "wall_s": ours_wall.to_dict(),
            "prefill_flops": flops,
            "prefill_flops_per_s": flops / ours_prefill.median if ours_prefill.median else 0.0,
        },
    }


def time_ours(c: Contestants, prompts: list[list[int]], n: int, dev: torch.device) -> dict:
    """One run of n tokens, plus (on CUDA) the same request replayed through CUDA graphs."""
    out = {"run": run_ours(c.engine, prompts, n, dev)}
    if dev.type == "cuda":
        out["graph"] = run_ours(c.engine, prompts, n, dev, cuda_graph=True).result
    return out


def measure_decode(
    c: Contestants, plan: BenchPlan, dev: torch.device, batch: int, prompt_len: int, progress
) -> dict:
    """TPOT at one batch size: n tokens per sequence, the soup pot's one-token-per-step loop.

    Both sides' TPOT come from one run each, timed on the caller's clock as each step's tokens
    come out (engine/bench/contestants.py `Run`); ours also reports its engine's own per-token metrics.
    """
    n = plan.decode_tokens
    prompts = random_prompts(c.vocab_size, batch, prompt_len, seed=2)
    hf_tpot, ours_tpot, ours_wall_tpot, ours_tps = Samples(), Samples(), Samples(), Samples()
    graph_tpot, graph_tpot_all = Samples(), Samples()
    kv_read, match = 0.0, 0
    for i in range(plan.warmup + plan.repeats):
        progress(f"decode batch {batch}, {n} tokens: run {i + 1}/{plan.warmup + plan.repeats}")
        hf, ours = alternate(
            i, lambda: run_hf(c.hf, prompts, n, dev), lambda: time_ours(c, prompts, n, dev)
        )
        if i < plan.warmup:
            continue
        hf_tpot.values.append(hf.tpot_s)
        res = ours["run"].result
        ours_tpot.values.append(res.metrics.tpot_s)
        ours_tps.values.append(res.metrics.decode_tps)
        ours_wall_tpot.values.append(ours["run"].tpot_s)
        if "graph" in ours:  # step 1 of a graphed request also records the graph: keep it apart
            graph_tpot_all.values.append(ours["graph"].metrics.tpot_s)
            graph_tpot.values.append(statistics.fmean(ours["graph"].metrics.itl_s[1:] or [0.0]))
        steps = res.trace.decode_steps
        kv_read = statistics.fmean(s.kv_tokens for s in steps) * c.engine.info.kv_bytes_per_token
        match = min(common_prefix(a, b) for a, b in zip(res.tokens, hf.tokens, strict=True))
    out = {
        "batch": batch,
        "prompt_tokens": prompt_len,
        "new_tokens": n,
        "hf": {"tpot_s": hf_tpot.to_dict(), "decode_tps": batch / hf_tpot.median if hf_tpot.median else 0.0},
        "ours": {
            "tpot_s": ours_tpot.to_dict(),
            "wall_tpot_s": ours_wall_tpot.to_dict(),
            "decode_tps": ours_tps.to_dict(),
            "weight_bytes_per_step": c.weight_read_bytes,
            "kv_bytes_read_per_step": kv_read,
            "achieved_read_bytes_per_s": (c.weight_read_bytes + kv_read) / ours_tpot.median,
        },
        "greedy_tokens_matching_hf": match,
    }
    if graph_tpot.values:
        out["ours_cuda_graph"] = {
            "tpot_s": graph_tpot.to_dict(),  # steps 2..n: replaying the recorded graph
            "tpot_with_capture_s": graph_tpot_all.to_dict(),  # all steps, recording included
        }
    return out


def profile_decode(eng, batch: int, prompt_len: int, steps: int, dev: torch.device, top: int = 15) -> dict:
    """Where one decode step of `batch` sequences spends its time, per op (torch.profiler self time).

    Runs `decode_one_token` directly, `steps` times after a real prefill, so prefill's big GEMMs do
    not mix into the table. `aten::mm` is the weight GEMVs: the memory-bound part; everything else
    (norms, RoPE, attention, Python between ops) is per-step overhead the roofline does not model.
    """


    cfg = eng.cfg
    prompts = random_prompts(cfg.vocab_size, batch, prompt_len, seed=3)
    slots = prompt_len + steps + 1
    pre = build_batch(prompts, "padded", dev, slots)
    cache = SeatPool(cfg, batch, slots, eng.model.dtype, dev)
    tok = prefill(eng.model, pre, cache).argmax(-1)[:, None]  # (B, 1)
    valid = pre.valid.clone()  # (B, slots): which cache slots hold real tokens

    def one_step(i: int) -> None:
        slot = pre.slots_used + i
        valid[:, slot] = True
        mask = valid[:, None, None, : slot + 1]  # (B, 1, 1, S)
        positions = torch.full((batch, 1), prompt_len + i, device=dev)  # (B, 1)
        decode_one_token(eng.model, tok, positions, torch.tensor([slot], device=dev), mask, cache)

    one_step(0)  # warm-up
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for i in range(1, steps + 1):
            one_step(i)
        synchronize(dev)
    attr = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, attr), reverse=True)
    total_us = sum(getattr(e, attr) for e in events)
    rows = [
        {
            "op": e.key,
            "calls_per_step": e.count / steps,
            "ms_per_step": getattr(e, attr) / steps / 1e3,
            "share": getattr(e, attr) / total_us if total_us else 0.0,
        }
        for e in events[:top]
    ]
    return {
        "batch": batch,
        "steps": steps,
        "timer": attr,
        "ms_per_step_total": total_us / steps / 1e3,
        "top_ops": rows,
    }
