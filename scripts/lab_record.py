"""Record one full lab run on this machine: every experiment's charts (PNG), tables (CSV), findings.

Why a script: the README's figures must be measurements, reproducible by anyone with one command,
not screenshots. It records every experiment of `lab.registry` with the compute function, figures
and tables its page uses and the settings its `record` gives (ranges that finish in a few minutes
on a small CPU), and writes:

    docs/lab-results/<experiment>-<n>.png    the page's charts (no guess drawn)
    docs/lab-results/<experiment>.csv        the page's (first) table; <experiment>-<table>.csv the others
    docs/lab-results/results.json            settings, findings, inspector verdicts, machine facts

Usage:
    .venv/bin/python scripts/lab_record.py                      # chef on cpu, the app's thread count
    .venv/bin/python scripts/lab_record.py --threads 1 --out /tmp/lab
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from engine import Engine  # noqa: E402
from lab.experiment import Experiment  # noqa: E402
from lab.export import write_pngs  # noqa: E402
from lab.registry import EXPERIMENTS  # noqa: E402
from serving.cores import engine_threads  # noqa: E402


def machine_facts(engine) -> dict:
    return {
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": engine.info.name,
        "device": engine.info.device,
        "dtype": engine.info.dtype,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "platform": platform.platform(),
    }


def record_one(engine, exp: Experiment, out: Path):
    """Run one experiment with its recording settings; write its charts and tables; its entry."""
    name, settings = exp.key, exp.record(engine.info)
    load, t0 = os.getloadavg()[0], time.perf_counter()
    result = exp.run(engine, settings, lambda p: print(f"  {name}: {p.line()}", flush=True))
    seconds = time.perf_counter() - t0
    figs = exp.figures(result, None)
    write_pngs(figs, [out / f"{name}-{i + 1}.png" for i in range(len(figs))])
    tables = exp.tables(result)
    for i, (table, frame) in enumerate(tables.items()):  # the first is <name>.csv, as on the page
        frame.to_csv(out / (f"{name}.csv" if i == 0 else f"{name}-{table}.csv"), index=False)
    print(f"{name}: {seconds:.1f} s; " + "; ".join(result.notes), flush=True)
    entry = {
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average_1m": [load, os.getloadavg()[0]],  # at its start and end: how busy the cores were
        "torch_threads": torch.get_num_threads(),
        "settings": asdict(settings),
        "seconds": seconds,
        "notes": result.notes,
        "charts": [f"{name}-{i + 1}.png" for i in range(len(figs))],
    }
    if getattr(result, "roof", None) is not None:
        entry["roof"] = result.roof.to_dict()  # bandwidth, FLOP/s, ridge and how they were measured
    return result, entry


def verdict(exp: Experiment, result, roof, dtype: str) -> dict:
    """The inspector on the experiment's result, with the roofline measured in this same recording."""
    v = exp.verdict(result, roof, dtype)
    return {
        "on": exp.verdict_on(result),
        "headline": v.headline,
        "decode_bound": v.decode_bound,
        "evidence": v.evidence,
    }


def summary_markdown(report: dict) -> str:
    """Every finding and verdict of the recording, as generated text (README.md is the prose)."""
    m = report["machine"]
    lines = [
        "# Lab recording: generated findings",
        "",
        f"Written by `scripts/lab_record.py`, the full run at {m['recorded_at']} (an experiment recorded "
        "later with `--only` says when): "
        f"{m['model']} on {m['device']} ({m['dtype']}), "
        f"torch {m['torch']} with {m['torch_threads']} thread(s) on {m['cpu_count']} CPU(s); 1-minute load "
        f"average {m['load_average_1m']:.1f} at the start, "
        f"{m.get('load_average_1m_end', float('nan')):.1f} at the end.",
    ]
    if m.get("note"):
        lines += ["", m["note"]]
    for name, e in report["experiments"].items():
        lines += ["", f"## {name} ({e['seconds']:.1f} s, settings `{json.dumps(e['settings'])}`)", ""]
        if "recorded_at" in e:  # recorded with --only, perhaps later than the others
            start, end = e["load_average_1m"]
            lines.append(
                f"- recorded at {e['recorded_at']} with {e['torch_threads']} torch thread(s); 1-minute load "
                f"average {start:.1f} at its start, {end:.1f} at its end"
                + (f" ({e['note']})" if e.get("note") else "")
            )
        lines += [f"- {note}" for note in e["notes"]]
        if "roof" in e:
            r = e["roof"]
            lines.append(
                f"- measured roofs: {r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s read bandwidth, "
                f"{r['flops_per_s'] / 1e9:.1f} GFLOP/s matmul, ridge {r['ridge_flop_per_byte']:.1f} FLOP/byte"
            )
        if "inspector" in e:
            lines.append(f"- inspector on {e['inspector']['on']}: {e['inspector']['headline']}")
        lines.append("- charts: " + ", ".join(f"`{c}`" for c in e["charts"]))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="chef")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument(
        "--threads",
        type=int,
        default=engine_threads(),
        help="torch threads (default: the app's rule, every core but one)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "lab-results")
    ap.add_argument("--only", nargs="*", help="record only these experiments")
    ap.add_argument(
        "--note",
        default="",
        help="a sentence about the conditions (e.g. a shared machine), kept in summary.md",
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, args.threads))
    args.out.mkdir(parents=True, exist_ok=True)
    engine = Engine.load(args.model, device=args.device, dtype=args.dtype)
    report = {"machine": machine_facts(engine), "experiments": {}}
    results = {}
    chosen = [e for e in EXPERIMENTS if not args.only or e.key in args.only]
    unknown = set(args.only or ()) - {e.key for e in EXPERIMENTS}
    if unknown:
        ap.error(
            f"unknown experiment(s) {', '.join(sorted(unknown))}: choose from {[e.key for e in EXPERIMENTS]}"
        )
    for exp in chosen:
        results[exp.key], report["experiments"][exp.key] = record_one(engine, exp, args.out)
        if args.note:
            report["experiments"][exp.key]["note"] = args.note
    if args.note and not args.only:
        report["machine"]["note"] = args.note
    roof = getattr(results.get("roofline"), "roof", None)
    for exp in chosen:
        report["experiments"][exp.key]["inspector"] = verdict(exp, results[exp.key], roof, args.dtype)
    report["machine"]["load_average_1m_end"] = os.getloadavg()[0]
    path = args.out / "results.json"
    if args.only and path.exists():  # keep the other experiments' earlier records and their machine facts
        earlier = json.loads(path.read_text())
        report["experiments"] = earlier.get("experiments", {}) | report["experiments"]
        report["machine"] = earlier.get("machine", report["machine"])
    path.write_text(json.dumps(report, indent=2, default=str))
    (args.out / "summary.md").write_text(summary_markdown(report))
    print(f"wrote {path} and summary.md")


if __name__ == "__main__":
    main()
