"""The class kitchen under a rush bigger than the room, measured on this machine (serving/clients/rush.py).

    .venv/bin/python scripts/class_rush.py --out docs/benchmarks/class-server-rush.json

Three runs, each on a fresh `two-pot-kitchen serve --model chef` on 127.0.0.1:
  1. 1,000 streaming clients at once, the default queue bound: answered, refused, mismatches against
     the same prompt alone, client TTFT / E2E, server + engine RSS before and after;
  2. 40 at once against `--max-seqs 4 --max-waiting 4`: how many are refused, how fast, the line and
     Retry-After they get;
  3. a slow reader (8 tables x 400 tokens, read 256 bytes every 50 ms) beside 30 students.
It writes the JSON and replaces the rush section of docs/benchmarks/class-server-cpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from kitchen_server import kitchen_process  # noqa: E402

from serving.clients.rush import rush, slow_reader  # noqa: E402

BEGIN, END = "<!-- rush: scripts/class_rush.py -->", "<!-- /rush -->"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "class-server-rush.json"))
    ap.add_argument("--md", default=str(REPO / "docs" / "benchmarks" / "class-server-cpu.md"))
    args = ap.parse_args()
    out: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                             "loadavg_before": os.getloadavg()}}  # fmt: skip
    with kitchen_process() as (url, proc):
        out["rush_1000"] = asdict(rush(url, proc.pid, 1000, max_tokens=8))
    with kitchen_process("--max-seqs", "4", "--max-waiting", "4") as (url, proc):
        out["bound_4_seats_4_waiting"] = asdict(rush(url, proc.pid, 40, max_tokens=48))
    with kitchen_process() as (url, proc):
        out["slow_reader"] = asdict(slow_reader(url, tables=8, max_tokens=400, others=30))
    out["machine"]["loadavg_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    md = Path(args.md)
    text = md.read_text()
    section = "\n".join(render(out))
    if BEGIN in text:
        text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    md.write_text(text)
    print(section)
    return 0


def render(d: dict) -> list[str]:
    """The markdown section, from the JSON alone."""
    ms = lambda x: "-" if x is None else f"{x * 1e3:,.0f}"  # noqa: E731
    r, b, s = d["rush_1000"], d["bound_4_seats_4_waiting"], d["slow_reader"]
    load = d["machine"]
    return [
        BEGIN,
        "## A rush bigger than the room",
        "",
        f"Measured {load['date']} by `scripts/class_rush.py` (serving/clients/rush.py; the same scenarios are asserted by "
        f"tests/test_class_rush.py). The machine was shared: load average {load['loadavg_before'][0]:.1f} before, "
        f"{load['loadavg_after'][0]:.1f} after, on {load['cpus']} cores.",
        "",
        "| run | clients | answered | refused | mismatches | TTFT p50 / p99 ms | E2E p99 ms | refused in p50 / p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| 1,000 streams at once, default bound (2,048 waiting) | {r['clients']:,} | {r['answered']:,} | {r['refused']} | "
        f"{r['mismatches']} | {ms(r['ttft_s']['p50'])} / {ms(r['ttft_s']['p99'])} | {ms(r['e2e_s']['p99'])} | - |",
        f"| 40 at once, `--max-seqs 4 --max-waiting 4` | {b['clients']} | {b['answered']} | {b['refused']} | "
        f"{b['mismatches']} | {ms(b['ttft_s']['p50'])} / {ms(b['ttft_s']['p99'])} | {ms(b['e2e_s']['p99'])} | "
        f"{ms(b['refused_in_s']['p50'])} / {ms(b['refused_in_s']['p99'])} |",
        "",
        f"- 1,000 at once: {r['answered']:,} answered in full, each equal to its prompt served alone; errors: "
        f"{len(r['errors'])}; {r['duration_s']:.1f} s for the whole rush; server + engine RSS "
        f"{r['rss_kb_before'] / 1024:,.0f} MB before, {r['rss_kb_after'] / 1024:,.0f} MB after "
        f"({r['rss_kb_after'] / r['rss_kb_before'] - 1:+.1%}); requests running afterwards: {r['running_after']:.0f}.",
        f"- Past the bound: {b['refused']} of {b['clients']} refused with 503, Retry-After {', '.join(b['retry_after'])} s, "
        f"one line: `{b['refusal_lines'][0] if b['refusal_lines'] else '-'}`. Every admitted one answered correctly.",
        f"- A slow reader ({s['tables']} tables, {s['total_bytes']:,} bytes of stream, read 256 bytes every 50 ms) "
        f"beside {s['others']} students: {s['others_answered']} of them answered ({s['others_mismatches']} mismatches, "
        f"TTFT p50 {ms(s['others_ttft_s']['p50'])} ms, p99 {ms(s['others_ttft_s']['p99'])} ms) while it had read "
        f"{s['read_when_others_done']:,} bytes; its own tables finished in the engine after {s['engine_done_s']:.1f} s, "
        f"when it had read {s['read_when_engine_done']:,}; it read the rest in {s['read_done_s']:.1f} s in all, "
        f"{s['slow_mismatches']} answers differing from the prompt alone.",
        END,
    ]


if __name__ == "__main__":
    sys.exit(main())
