"""Record the serving measurements on this machine into docs/benchmarks/serving-cpu.{json,md}.

    .venv/bin/python scripts/record_serving.py [--quick]

Runs each benchmark as its own process with --json (the same commands a reader can run), keeps
every raw result in the JSON file, and writes the markdown from those numbers alone, with each
goal of the serving issues checked against them. Nothing in the markdown is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
THREADS = "2"

SERVE_RUNS = {
    # name: (model, arguments) -- each replays one seeded Poisson stream under every policy
    "chef_rush": ("chef", ["--requests", "400", "--rate", "150", "--prompt-len", "uniform:16:64",
                           "--output-len", "choice:8,8,8,8,8,8,8,8,400", "--max-seqs", "32"]),
    "chef_banquet": ("chef", ["--requests", "100", "--rate", "20", "--prompt-len",
                              "choice:16,16,16,16,16,16,16,16,16,448", "--output-len", "64", "--token-budget", "64"]),
    "smollm2_rush": ("preset:smollm2-135m", ["--requests", "120", "--rate", "40", "--prompt-len", "uniform:16:64",
                                             "--output-len", "choice:8,8,8,8,8,8,8,8,160", "--max-seqs", "32",
                                             "--max-seq-len", "512"]),
    "smollm2_banquet": ("preset:smollm2-135m", ["--requests", "40", "--rate", "3", "--prompt-len",
                                                "choice:16,16,16,16,16,16,16,16,16,400", "--output-len", "32",
                                                "--token-budget", "64", "--max-seq-len", "512"]),
}  # fmt: skip


def run_json(args: list[str], timeout: float = 1800) -> object:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=THREADS)
    t = time.time()
    out = subprocess.run([PY, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {out.stderr.strip()[-400:]}")
    print(f"  {' '.join(args[:4])} ... {time.time() - t:.0f} s", file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def policy_table(run: dict) -> list[str]:
    rows = ["| policy | req/s | tok/s | TTFT p50 / p99 ms | TPOT p50 ms | ITL p50 / p99 ms | goodput req/s | preempted |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, r in run["policies"].items():
        rows.append(f"| {name} | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.0f} | {ms(r['ttft_s']['p50'])} / "
                    f"{ms(r['ttft_s']['p99'])} | {ms(r['tpot_s']['p50'])} | {ms(r['itl_s']['p50'])} / "
                    f"{ms(r['itl_s']['p99'])} | {r['goodput']:.2f} | {r['preemptions']} |")  # fmt: skip
    return rows


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "serving-cpu"))
    ap.add_argument("--only", nargs="*", default=None, help="names of SERVE_RUNS to run (default all)")
    ap.add_argument("--parts", nargs="*", default=None,
                    help="re-measure only these parts (decode_step kv_layout prefix_reuse speculation two_kitchens); "
                         "the others are kept from the existing JSON")
    args = ap.parse_args()
    data: dict = {"machine": {"cpus": os.cpu_count(), "threads": THREADS, "python": platform.python_version(),
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}  # fmt: skip
    old = json.loads(Path(args.out + ".json").read_text()) if Path(args.out + ".json").exists() else {}
    old_dates, old_date = old.get("dates", {}), old.get("machine", {}).get("date", "?")
    dates: dict[str, str] = {}
    data["serve_bench"] = {}
    for name, (model, extra) in SERVE_RUNS.items():
        if args.only is not None and name not in args.only:
            data["serve_bench"][name] = old["serve_bench"][name]  # recorded by an earlier run, kept
            data.setdefault("kept", []).append(f"serve-bench {name}")
            dates[f"serve-bench {name}"] = old_dates.get(f"serve-bench {name}", old_date)
        else:
            data["serve_bench"][name] = run_json(["-m", "engine", "serve-bench", "--model", model, "--policy", "all",
                                                  "--threads", THREADS, "--json", *extra])  # fmt: skip
            data["serve_bench"][name]["command"] = f"python -m engine serve-bench --model {model} --policy all " + " ".join(extra)
    parts = {
        "decode_step": lambda: {m: run_json(["-m", "engine", "serve-bench", "--model", m, "--policy", "none", "--threads",
                                             THREADS, "--decode-step", "1,32", "--decode-repeats", "15", "--requests", "1",
                                             "--json"])["decode_step"]
                                for m in ("chef", "preset:smollm2-135m")},
        "kv_layout": lambda: run_json(["-m", "engine.bench.kv_layout", "--json"]),
        "prefix_reuse": lambda: {m: run_json(["-m", "engine.bench.prefix_reuse", "--model", m, "--prompt-len", "400", "--shared",
                                              "0.9", "--threads", THREADS, "--json"]) for m in ("chef", "preset:smollm2-135m")},
        "speculation": lambda: run_json(["-m", "engine.bench.speculation", "--model", "chef", "--speculate", "4", "--threads",
                                         THREADS, "--json"]),
        "two_kitchens": lambda: run_json(["scripts/two_kitchens_run.py"]),
    }  # fmt: skip
    for name, measure in parts.items():
        data[name] = measure() if args.parts is None or name in args.parts else old[name]
        if args.parts is not None and name not in args.parts:
            data.setdefault("kept", []).append(name)  # recorded by an earlier run, kept as it was
            dates[name] = old_dates.get(name, old_date)
    data["dates"] = dates  # when each kept part was measured (the others: machine.date)
    Path(args.out + ".json").write_text(json.dumps(data, indent=1) + "\n")
    Path(args.out + ".md").write_text("\n".join(render(data)) + "\n")
    print(f"wrote {args.out}.json and .md", file=sys.stderr)
    return 0


def render(d: dict) -> list[str]:
    m = d["machine"]
    out = ["# Serving on this CPU: policies, the KV layout, leftovers, the apprentice, two kitchens",
           "",
           f"Measured {m['date']} on this project's machine ({m['cpus']} cores, torch with {m['threads']} threads, "
           "float32), by `scripts/record_serving.py`: every number below is copied by the script from the JSON "
           "the benchmarks printed (`serving-cpu.json` beside this file), and each goal is checked against them. "
           "The machine is shared, so single runs move by several percent; the ratios compare runs made "
           "back to back in one process.", ""]  # fmt: skip
    if d.get("kept"):
        kept = "; ".join(f"{part} ({d['dates'][part]})" for part in d["kept"])
        out += [f"Parts kept from earlier runs, not re-measured at {m['date']}: {kept}.", ""]
    for name, run in d["serve_bench"].items():
        out += [f"## serve-bench: {name}", "", f"`{run['command']}`", ""] + policy_table(run) + [""]
        r = run["ratios"]
        if "rush" in name:
            st, co = run["policies"]["static"], run["policies"]["continuous"]
            ok = r["continuous_vs_static_requests_per_s"] >= 2 and co["ttft_s"]["p50"] <= st["ttft_s"]["p50"]
            out.append(f"Goal, continuous >= 2x static requests/s with p50 TTFT no worse: "
                       f"{r['continuous_vs_static_requests_per_s']:.2f}x, p50 TTFT {ms(co['ttft_s']['p50'])} vs "
                       f"{ms(st['ttft_s']['p50'])} ms: {verdict(ok)}.")  # fmt: skip
        else:
            ch, co = run["policies"]["chunked"], run["policies"]["continuous"]
            ok = r["chunked_vs_continuous_itl_p99"] <= 0.5
            out.append(f"Goal, chunked p99 ITL <= 0.5x continuous's while long prompts arrive: "
                       f"{r['chunked_vs_continuous_itl_p99']:.2f}x ({ms(ch['itl_s']['p99'])} vs {ms(co['itl_s']['p99'])} ms): "
                       f"{verdict(ok)}. The price in TTFT: p50 {ms(ch['ttft_s']['p50'])} vs {ms(co['ttft_s']['p50'])} ms, "
                       f"p99 {ms(ch['ttft_s']['p99'])} vs {ms(co['ttft_s']['p99'])} ms.")  # fmt: skip
        out.append("")
    out += ["## A decode step: serving path against the fixed-batch path", "",
            "`python -m engine serve-bench --model M --policy none --decode-step 1,32 --decode-repeats 15`: wall-clock "
            "per decode step, the same prompts and new tokens, fixed / serving / order / fixed again in each round, "
            "median of 15, each side timing its own decode steps. All three run the torch forward op by op, "
            "the one forward the fixed path has: the question is the serving path's bookkeeping, and the "
            "native step's speed is `python -m engine bench`'s. The last "
            "column is the fixed path against itself: the noise of this measurement.", "",
            "The order column is the same order through `generate()`, which now cooks it on seats "
            "(engine/request_group.py): the Kitchen's and the lab's path.", "",
            "| model | batch | fixed-batch ms | serving ms | serving / fixed | order on seats ms | order / fixed "
            "| fixed / fixed (A/A) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for model, rows in d["decode_step"].items():
        for t in rows:
            out.append(f"| {model} | {t['batch']} | {t['fixed_ms']:.2f} | {t['serving_ms']:.2f} | {t['ratio']:.3f} | "
                       f"{t['order_ms']:.2f} | {t['order_ratio']:.3f} | {t['aa_ratio']:.3f} |")  # fmt: skip
    rows = [t for r in d["decode_step"].values() for t in r]
    worst = max(max(t["ratio"], t["order_ratio"]) for t in rows)
    noise = max(abs(t["aa_ratio"] - 1) for t in rows)
    within = worst <= 1.0 + noise
    out += ["", f"Goal, no slower than the static path at the same batch: worst ratio {worst:.3f}, the A/A spread "
            f"{noise * 100:.1f} %: {verdict(worst <= 1.0) if worst <= 1.0 else ('**within the noise**' if within else '**not met**')}.",
            ""]  # fmt: skip
    out += ["## KV layout: seats against blocks (docs/design/kv-cache.md)", "", "`python -m engine.bench.kv_layout`", "",
            "| shape | batch | context | seats ms | blocks + gather ms | blocks / seats |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in d["kv_layout"]:
        out.append(f"| {r['shape']} | {r['batch']} | {r['context']} | {r['seats_ms']:.3f} | {r['blocks_ms']:.3f} | "
                   f"{r['blocks_vs_seats']:.2f} |")  # fmt: skip
    out += ["", "## Leftovers: an order whose prefix is cached", "",
            "`python -m engine.bench.prefix_reuse --model M --prompt-len 400 --shared 0.9`", "",
            "| model | prompt | shared | TTFT cold ms | TTFT cached ms | cached / cold |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for model, r in d["prefix_reuse"].items():
        out.append(f"| {model} | {r['prompt_len']} | {r['shared_tokens']} | {ms(r['cold_ttft_s'])} | {ms(r['warm_ttft_s'])} | "
                   f"{r['ratio']:.2f} ({verdict(r['ratio'] <= 0.3)}: goal <= 0.3) |")  # fmt: skip
    out += ["", "## The apprentice: prompt-lookup drafts (K = 4), chef, greedy", "",
            "`python -m engine.bench.speculation --model chef --speculate 4`", "",
            "| order | plain tok/s | speculating tok/s | speedup | identical | mean acceptance length | accepted per position |",
            "|---|---:|---:|---:|---|---:|---|"]  # fmt: skip
    for r in d["speculation"]:
        out.append(f"| {r['order']} | {r['plain_tps']:.0f} | {r['spec_tps']:.0f} | {r['speedup']:.2f} | {r['identical']} | "
                   f"{r['mean_acceptance_length']:.2f} | {r['accepted_at']} |")  # fmt: skip
    copy = next(r for r in d["speculation"] if r["order"] == "copy")
    out += ["", f"Goal, >= 1.5x decode tokens/s on a copy-heavy prompt with identical output: {copy['speedup']:.2f}x, "
            f"identical {copy['identical']}: {verdict(copy['speedup'] >= 1.5 and copy['identical'])}.", ""]  # fmt: skip
    tk = d["two_kitchens"]
    out += ["## Two kitchens: prefill and decode in two processes, K/V over gloo", "",
            "`python scripts/two_kitchens_run.py` (chef)", "",
            f"The link measured first, one message each of 4 KB to 16 MB, fitted as latency + bytes / bandwidth: "
            f"{tk['link']['latency_s'] * 1e6:.0f} us + bytes / {tk['link']['bytes_per_s'] / 1e9:.2f} GB/s.", "",
            "| prompt tokens | KV bytes | prefill ms | transfer ms | predicted ms | first decode ms | TTFT ms | round trip exact | same tokens |",
            "|---:|---:|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for r in tk["runs"]:
        out.append(f"| {r['prompt_tokens']} | {r['kv_bytes']:,} | {ms(r['prefill_s'])} | {r['transfer_s'] * 1e3:.3f} | "
                   f"{r['predicted_transfer_s'] * 1e3:.3f} | {ms(r['first_decode_s'])} | {ms(r['ttft_s'])} | "
                   f"{r['round_trip_exact']} | {r['same_tokens']} |")  # fmt: skip
    within = all(r["transfer_s"] <= 2 * r["predicted_transfer_s"] and r["predicted_transfer_s"] <= 2 * r["transfer_s"]
                 for r in tk["runs"])  # fmt: skip
    out += ["", f"Goal, transfer within 2x of latency + bytes / bandwidth: {verdict(within)}.", ""]
    return out


if __name__ == "__main__":
    sys.exit(main())
