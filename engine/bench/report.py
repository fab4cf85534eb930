"""The benchmark's verdicts: ratios from the measurements, the targets, roofline bounds, the text report.

`engine/bench/bench.py` measures; this module only computes and formats, so its arithmetic can be
tested on hand-made measurement dicts. Every ratio is ours / reference (times: under 1 is better;
rates: over 1 is better) or achieved / roof.
"""

from __future__ import annotations

import json
import random
import statistics

from engine.bench.roofline import Roofline

# name -> (comparison, target): "<=" means ours / reference must stay at or under the target.
TARGETS = {
    "decode_tpot_vs_hf_b1": ("<=", 0.5),
    "decode_bw_fraction": (">=", 0.70),
    "prefill_flops_fraction": (">=", 0.85),
    "ttft_vs_hf": ("<=", 0.9),
    "decode_tps_vs_hf_b32": (">=", 1.5),
    "decode_tpot_cuda_graph_vs_hf_b1": ("<=", 1 / 5),  # the goal: "graphs >= 5x HF eager"; cuda only
    # the GPU goals (bf16, CUDA graphs, batch 1) as measured / goal, so 1 is the line:
    "decode_tpot_cuda_graph_vs_goal_b1": ("<=", 1.0),
    "prefill_flops_fraction_vs_gpu_goal": (">=", 1.0),
}
GPU_TPOT_GOAL_S = {"preset:smollm2-135m": 1.0e-3, "preset:llama-3.2-1b": 1.2e-3}  # batch-1 TPOT with graphs
GPU_PREFILL_GOAL = {"preset:llama-3.2-1b": 0.65}  # of the measured GEMM peak, 8 x 1024 prompt tokens


def gpu_goal_ratios(model: str, device: str, ratios: dict, b1: dict) -> dict:
    """The goals for the shapes where they mean something on a GPU (empty elsewhere).
    Example: the 1B shape at 1.5 ms per token with graphs -> decode_tpot_cuda_graph_vs_goal_b1 1.25."""
    if not device.startswith("cuda"):
        return {}
    out = {}
    if model in GPU_TPOT_GOAL_S and "ours_cuda_graph" in b1:
        out["decode_tpot_cuda_graph_vs_goal_b1"] = b1["ours_cuda_graph"]["tpot_s"]["median"] / GPU_TPOT_GOAL_S[model]
    if model in GPU_PREFILL_GOAL and "prefill_flops_fraction" in ratios:
        out["prefill_flops_fraction_vs_gpu_goal"] = ratios["prefill_flops_fraction"] / GPU_PREFILL_GOAL[model]
    return out


def derive_ratios(roof: Roofline, prefill: dict, b1: dict, bbig: dict) -> dict:
    """Ours / reference, or achieved / roof. Under 1 is better for times, over 1 for rates."""
    hf_b1 = b1["hf"]["tpot_s"]["median"]
    ratios = {
        "decode_tpot_vs_hf_b1": b1["ours"]["tpot_s"]["median"] / hf_b1,
        "decode_bw_fraction": b1["ours"]["achieved_read_bytes_per_s"] / roof.bandwidth_bytes_per_s,
        "prefill_flops_fraction": prefill["ours"]["prefill_flops_per_s"] / roof.flops_per_s,
        "ttft_vs_hf": prefill["ours"]["ttft_s"]["median"] / prefill["hf"]["ttft_s"]["median"],
        "decode_tps_vs_hf_b32": bbig["ours"]["decode_tps"]["median"] / bbig["hf"]["decode_tps"],
        # Wall-clock twins of the first and fourth: the same formula for both sides.
        "decode_tpot_wall_vs_hf_b1": b1["ours"]["wall_tpot_s"]["median"] / hf_b1,
        "ttft_wall_vs_hf": prefill["ours"]["wall_s"]["median"] / prefill["hf"]["ttft_s"]["median"],
    }
    if "ours_cuda_graph" in b1:
        graph = b1["ours_cuda_graph"]
        ratios["decode_tpot_cuda_graph_vs_hf_b1"] = graph["tpot_s"]["median"] / hf_b1
        ratios["decode_tpot_cuda_graph_with_capture_vs_hf_b1"] = (
            graph["tpot_with_capture_s"]["median"] / hf_b1
        )
    return ratios


def roofline_bounds(roof: Roofline, prefill: dict, b1: dict, bbig: dict, elem_bytes: int) -> dict:
    """The best each ours-vs-HF ratio could be if our side ran AT the measured roofs, with no overhead.

    Decode must read every weight (and the cached K/V) once per step, so a step can take no less
    than bytes / read bandwidth; at batch B it also does 2 x params x B FLOPs, so no less than
    FLOPs / GEMM roof either. Prefill does its counted FLOPs, so TTFT >= FLOPs / GEMM roof.
    Dividing that floor by HF's measured time gives the best ratio any implementation could show on
    this machine. Worked example: 541 MB per step at 27 GB/s is 20 ms; if HF's TPOT is 45 ms the
    bound is 0.44, so a target of 0.5 needs 88 % of the roof with zero per-step overhead.
    """
    bw, flops = roof.bandwidth_bytes_per_s, roof.flops_per_s

    def step_floor(d: dict) -> float:
        read = d["ours"]["weight_bytes_per_step"] + d["ours"]["kv_bytes_read_per_step"]
        work = 2 * d["ours"]["weight_bytes_per_step"] / elem_bytes * d["batch"]
        return max(read / bw, work / flops)

    return {
        "decode_tpot_vs_hf_b1": step_floor(b1) / b1["hf"]["tpot_s"]["median"],
        "ttft_vs_hf": prefill["ours"]["prefill_flops"] / flops / prefill["hf"]["ttft_s"]["median"],
        "decode_tps_vs_hf_b32": bbig["batch"] / step_floor(bbig) / bbig["hf"]["decode_tps"],
        "decode_bw_fraction": 1.0,
        "prefill_flops_fraction": 1.0,
    }


def kernel_bounds(ceil: dict, roof: Roofline, prefill: dict, b1: dict, bbig: dict) -> dict:
    """The best each ratio could be if our side were nothing but its GEMM (and attention) kernels.

    `ceil` is engine/bench/ceilings.py's measurement: the model's own weights through the same calls,
    nothing in between. Unlike `roofline_bounds` these are speeds real kernels reach on this
    machine, so a target beyond them cannot be met by cutting overhead: it needs faster kernels.
    Decode bandwidth counts the step's K/V bytes too, which the chain does not read: generous.
    """
    step_b1, step_big = ceil["decode_step_s"]["b1"], ceil["decode_step_s"][f"b{bbig['batch']}"]
    read_b1 = b1["ours"]["weight_bytes_per_step"] + b1["ours"]["kv_bytes_read_per_step"]
    return {
        "decode_tpot_vs_hf_b1": step_b1 / b1["hf"]["tpot_s"]["median"],
        "decode_bw_fraction": read_b1 / step_b1 / roof.bandwidth_bytes_per_s,
        "prefill_flops_fraction": prefill["ours"]["prefill_flops"] / ceil["prefill_s"] / roof.flops_per_s,
        "ttft_vs_hf": ceil["prefill_s"] / prefill["hf"]["ttft_s"]["median"],
        "decode_tps_vs_hf_b32": bbig["batch"] / step_big / bbig["hf"]["decode_tps"],
    }


def check_targets(ratios: dict, bounds: dict | None = None, kernels: dict | None = None) -> dict:
    """Each target: the value, met or not, and how much of each ceiling meeting it would take.

    `roof_share_needed` = the fraction of the roofline-limited speed the target demands: over 1
    means no implementation can meet it on this machine at the measured roofs.
    `kernel_share_needed` = the same against the kernel ceiling (engine/bench/ceilings.py): over 1
    means no engine calling these GEMM kernels can meet it, however little else it does.
    """
    out = {}
    for name, (op, target) in TARGETS.items():
        if name in ratios:
            value = ratios[name]
            out[name] = {
                "value": value,
                "target": f"{op} {target:.3g}",
                "met": bool(value <= target if op == "<=" else value >= target),
            }
            for key, share, given in (
                ("bound", "roof_share_needed", bounds),
                ("kernel_bound", "kernel_share_needed", kernels),
            ):
                if given and name in given:
                    bound = given[name]
                    out[name] |= {key: bound, share: bound / target if op == "<=" else target / bound}
    return out


def format_report(r: dict) -> str:
    """The human-readable summary: the roofs, the headline timings, then the ratios vs targets."""
    roof, pre, b1 = r["roofline"], r["prefill"], r["decode_b1"]
    big = r[f"decode_b{r['plan']['big_batch']}"]
    ms = 1e3
    lines = [
        f"bench {r['model']} on {r['device']} {r['dtype']}, {r['machine']['torch_threads']} threads, "
        f"{r['plan']['repeats']} repeats after {r['plan']['warmup']} warm-up; {r['elapsed_s']:.0f} s",
        f"roofline: read {roof['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, GEMM {roof['flops_per_s'] / 1e9:.0f} GFLOP/s,"
        f" ridge {roof['ridge_flop_per_byte']:.1f} FLOP/byte",
        f"prefill {pre.get('prompt_batch', 1)} x {pre['prompt_tokens']} tok: TTFT ours {pre['ours']['ttft_s']['median'] * ms:.0f} ms"
        f" (wall {pre['ours']['wall_s']['median'] * ms:.0f}), HF {pre['hf']['ttft_s']['median'] * ms:.0f} ms;"
        f" ours {pre['ours']['prefill_flops_per_s'] / 1e9:.0f} GFLOP/s",
        f"decode b1 ({b1['new_tokens']} tok): TPOT ours {b1['ours']['tpot_s']['median'] * ms:.1f} ms"
        f" (wall {b1['ours']['wall_tpot_s']['median'] * ms:.1f}), HF {b1['hf']['tpot_s']['median'] * ms:.1f} ms;"
        f" ours reads {b1['ours']['achieved_read_bytes_per_s'] / 1e9:.1f} GB/s",
        f"decode b{big['batch']}: ours {big['ours']['decode_tps']['median']:.0f} tok/s,"
        f" HF {big['hf']['decode_tps']:.0f} tok/s",
    ]
    if "ours_cuda_graph" in b1:
        lines.append(
            f"decode b1 with CUDA graphs: TPOT {b1['ours_cuda_graph']['tpot_s']['median'] * ms:.2f} ms"
        )
    lines.append("ratios (ours / reference or achieved / roof):")
    for name, value in r["ratios"].items():
        t = r["targets"].get(name)
        verdict = f"  target {t['target']}: {'met' if t['met'] else 'NOT met'}" if t else ""
        if t and "roof_share_needed" in t and t["bound"] != 1.0:
            verdict += f" (roofline bound {t['bound']:.3f}: needs {t['roof_share_needed']:.0%} of the roof)"
        if t and "kernel_share_needed" in t:
            verdict += f" (kernels alone {t['kernel_bound']:.3f}: needs {t['kernel_share_needed']:.0%} of their speed)"
        lines.append(f"  {name:34s} {value:7.3f}{verdict}")
    return "\n".join(lines)


def save_json(report: dict, out: str | None, indent: int = 2) -> str:
    """The report as JSON text, also written to `out` when given: every bench's report file."""
    text = json.dumps(report, indent=indent)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return text


def emit(report: dict, out: str | None, as_json: bool, text_of) -> int:
    """Write the JSON report to `out` (if given) and print it, or its summary `text_of(report)`."""
    text = save_json(report, out)
    print(text if as_json else text_of(report))
    return 0


def paired(a: list[float], b: list[float], resamples: int = 4000) -> dict:
    """Each round's B/A - 1 (the two sides ran back to back, so a slow minute slows both), their
    median, and a 95 % bootstrap interval of that median (seeded: the same samples, the same
    interval). A budget is met when the interval's upper end is under it."""
    ratios = sorted(y / x - 1 for x, y in zip(a, b, strict=True))
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return {"paired_overheads": ratios, "paired_median": statistics.median(ratios),
            "paired_ci95": [meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]]}  # fmt: skip
