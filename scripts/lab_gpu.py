"""The lab on a GPU in two halves: compute on the GPU machine, draw on a CPU machine afterwards.

Why two halves: a GPU machine is lent for minutes and may lack the browser that renders PNGs
(kaleido drives Chromium); the measurements are what needs the GPU. So:

    # on the GPU machine (scripts/gpu_check.sh runs this), results pickled under OUT:
    python scripts/lab_gpu.py compute --device cuda --dtype bfloat16 --models chef preset:smollm2-135m \\
        --out $OUT/lab-gpu --budget-s 110
    # back on a CPU machine, with the same checkout:
    .venv/bin/python scripts/lab_gpu.py render --results <copied lab-gpu folder> --out docs/lab-results-gpu

`compute` runs every experiment of `lab.registry` with the settings its `record` gives, one model at
a time, and pickles each result with its settings, timing and machine facts; it starts no new
experiment once `--budget-s` has passed (what finished is kept, what was skipped is listed).
`render` draws each result with the page's own figures and tables into
`<out>/<model>/<experiment>-<n>.png`, `.csv`, and writes `<out>/summary.md`.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
import traceback
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from engine import Engine  # noqa: E402
from lab.export import write_pngs  # noqa: E402
from lab.registry import EXPERIMENTS, experiment  # noqa: E402


def slug(model: str) -> str:
    return model.replace("preset:", "").replace("/", "_")


def compute(args) -> int:
    t_start, failed = time.perf_counter(), 0
    args.out.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        engine = Engine.load(model, device=args.device, dtype=args.dtype)
        for exp in EXPERIMENTS:
            if time.perf_counter() - t_start > args.budget_s:
                print(f"skipped {model} {exp.key}: past the {args.budget_s:.0f} s budget", flush=True)
                continue
            settings, t0, load = exp.record(engine.info), time.perf_counter(), os.getloadavg()[0]
            try:
                result = exp.run(engine, settings, None)
            except Exception as err:  # noqa: BLE001 - one experiment's failure is reported, the rest go on
                failed += 1
                print(f"FAIL {model} {exp.key}: {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)
                traceback.print_exc(file=sys.stderr)
                continue
            record = {
                "model": model, "experiment": exp.key, "settings": asdict(settings), "result": result,
                "seconds": time.perf_counter() - t0, "load_average_1m": [load, os.getloadavg()[0]],
                "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "device": engine.info.device, "dtype": engine.info.dtype, "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            }  # fmt: skip
            with open(args.out / f"{slug(model)}--{exp.key}.pkl", "wb") as f:
                pickle.dump(record, f)
            print(f"ok {model} {exp.key}: {record['seconds']:.1f} s; " + "; ".join(result.notes), flush=True)
        del engine
    return failed


def render(args) -> int:
    records = [pickle.loads(p.read_bytes()) for p in sorted(args.results.glob("*.pkl"))]
    if not records:
        print(f"error: no *.pkl results in {args.results}", file=sys.stderr)
        return 2
    lines = ["# The lab on a GPU: generated findings", "",
             "Computed on the GPU by `scripts/lab_gpu.py compute` (from `scripts/gpu_check.sh`), drawn "
             "afterwards on a CPU machine by `scripts/lab_gpu.py render`."]  # fmt: skip
    for rec in records:
        exp, result = experiment(rec["experiment"]), rec["result"]
        folder = args.out / slug(rec["model"])
        folder.mkdir(parents=True, exist_ok=True)
        figs = exp.figures(result, None)
        write_pngs(figs, [folder / f"{exp.key}-{i + 1}.png" for i in range(len(figs))])
        for i, (table, frame) in enumerate(exp.tables(result).items()):
            frame.to_csv(folder / (f"{exp.key}.csv" if i == 0 else f"{exp.key}-{table}.csv"), index=False)
        lines += ["", f"## {rec['model']}: {exp.nav_title}", "",
                  f"- {rec['gpu']}, {rec['dtype']}, torch {rec['torch']}, recorded {rec['recorded_at']}, "
                  f"{rec['seconds']:.1f} s; settings `{rec['settings']}`"]  # fmt: skip
        lines += [f"- {note}" for note in result.notes]
        lines.append("- charts: " + ", ".join(f"`{slug(rec['model'])}/{exp.key}-{i + 1}.png`" for i in range(len(figs))))
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(records)} experiments' charts and tables and {args.out / 'summary.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compute", help="on the GPU machine: run and pickle every experiment")
    c.add_argument("--models", nargs="+", default=["chef", "preset:smollm2-135m"])
    c.add_argument("--device", default="cuda")
    c.add_argument("--dtype", default="bfloat16")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--budget-s", type=float, default=110.0, help="start no experiment after this many seconds")
    r = sub.add_parser("render", help="on a CPU machine: draw the pickled results")
    r.add_argument("--results", type=Path, required=True)
    r.add_argument("--out", type=Path, default=REPO / "docs" / "lab-results-gpu")
    args = ap.parse_args(argv)
    return compute(args) if args.command == "compute" else render(args)


if __name__ == "__main__":
    raise SystemExit(main())
