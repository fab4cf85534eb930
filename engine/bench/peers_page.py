"""The peer bench's page (docs/benchmarks/peers-cpu.md): its tables written from the report, and the
findings below a marker kept as they are when the tables are rewritten."""

from __future__ import annotations

from pathlib import Path


def page(report: dict) -> str:
    p = report["plan"]
    lines = [
        "# Our engine beside llama.cpp on this CPU",
        "",
        "Written by `python -m engine bench peers` (engine/bench/peers.py); the JSON beside it has every sample.",
        f"Measured {report['timestamp_utc']} on {report['machine']['cpu']} ({report['machine']['cpu_count']} cores), "
        f"{p['threads']} thread{'s' if p['threads'] > 1 else ''} each, {p['rounds']} alternating rounds, load average "
        f"{report['load_average']['min']:.2f}-{report['load_average']['max']:.2f}; llama.cpp {' '.join(report['llama_cpp'].split())}.",
        f"Decode: batch 1, {p['decode_new']} new tokens after a {p['decode_prompt']}-token prompt. Prefill: one "
        f"{p['prefill']}-token prompt. Batched: {p['batch']} sequences, {p['batch_new']} new tokens each after "
        f"{p['batch_prompt']}-token prompts (llama.cpp: `llama-batched-bench`). Tokens/s, median (min-max).",
        "",
    ]  # fmt: skip
    for model, m in report["models"].items():
        loads = m.get("ours_loads", {})
        same = [f"{k} from `{Path(v).name}`" for k, v in loads.items() if str(v).endswith(".gguf")]
        source = f" Ours loads the files llama.cpp runs: {', '.join(same)}." if same else ""
        lines += [f"## {model}", "", f"Prefill prompt: {m['plan']['prefill']} tokens.{source}", "",
                  "| contestant | decode | prefill | batched decode | greedy = HF |", "|---|---:|---:|---:|---:|"]  # fmt: skip
        for name, res in m["results"].items():
            cells = [_cell(res.get(k)) for k in ("decode_tps", "prefill_tps", "batch_decode_tps")]
            agree = m["greedy_tokens_matching_hf"].get(name)
            agreed = "" if agree is None else f"{agree}/{m['greedy_of']}"
            lines.append(f"| {name} | {' | '.join(cells)} | {agreed} |")
        ceil = m["kernel_ceilings_tps"]
        if ceil:
            lines.append(f"| kernel ceiling (torch's GEMMs alone, fp32) | {ceil['ceiling_decode_tps']:,.0f} | "
                         f"{ceil['ceiling_prefill_tps']:,.0f} | {ceil['ceiling_batch_decode_tps']:,.0f} | |")  # fmt: skip
            if "ceiling_native_decode_tps" in ceil:
                lines.append(f"| kernel ceiling (the native step's products alone, fp32) | "
                             f"{ceil['ceiling_native_decode_tps']:,.0f} | "
                             f"{ceil.get('ceiling_native_prefill_tps', 0):,.0f} | "
                             f"{ceil['ceiling_native_batch_decode_tps']:,.0f} | |")  # fmt: skip
        lines += ["", "| ratio (ours / llama.cpp) | measured | target | met | kernel ceiling |", "|---|---:|---:|---|---:|"]
        for k, v in m["ratios"].items():
            t = m["targets"].get(k, {})
            c = m["ceiling_ratios"].get(k) if "fp32" in k else None
            target = f"{t['target']:.1f}" if t else ""
            met = ("yes" if t["met"] else "no") if t else ""
            name = " vs ".join((k.split("_vs_")[0].replace("_", " "), k.split("_vs_")[1]))
            lines.append(f"| {name} | {v:.2f} | {target} | {met} | {'' if c is None else f'{c:.2f}'} |")
        lines.append("")
    return "\n".join(lines)


def _cell(s: dict | None) -> str:
    return "" if s is None else f"{s['median']:,.1f} ({s['min']:,.1f}-{s['max']:,.1f})"


FINDINGS = "<!-- findings: text below this line is kept when the page is rewritten -->"


def write_page(path: Path, text: str) -> None:
    kept = path.read_text().split(FINDINGS, 1)[1] if path.is_file() and FINDINGS in path.read_text() else "\n"
    path.write_text(text + "\n" + FINDINGS + kept)
