"""guidellm's concurrency sweep against the class kitchen and `transformers serve` on the same model.

    .venv/bin/python scripts/guidellm_sweep.py --out docs/benchmarks/class-server-guidellm.json

Starts each server on 127.0.0.1 (ours: `two-pot-kitchen serve --model chef`; theirs: `transformers
serve --continuous-batching` on the same folder), runs the SAME guidellm command against each
(after one warm-up order each; `--profile concurrent`, 1, 2, 4, 8, 16 and 32 streams, each for `--seconds`; synthetic prompts of
`--prompt-tokens` tokens, at most `--output-tokens` new tokens each as `max_tokens`: guidellm's exact
output lengths send vLLM's `ignore_eos`, which `transformers serve` refuses with 422, so the
comparison asks for a ceiling, and both servers may stop early at EOS), and writes guidellm's own
figures per concurrency: requests done and errored, requests/s, output tokens/s, TTFT and ITL
(median and p99, ms). Nothing is copied from elsewhere. `transformers serve` needs `pip install
fastapi accelerate`; without them its half is skipped and the report says so.
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
sys.path.insert(0, str(REPO / "scripts"))

from class_load import CHEF, free_port, start, stop  # noqa: E402

STREAMS = (1, 2, 4, 8, 16, 32)


def guidellm(url: str, route: str, args, out: Path) -> list[dict]:
    cmd = [str(Path(sys.executable).parent / "guidellm"), "run",
           "--backend", f"kind=openai_http,target={url},request_format={route},max_tokens={args.output_tokens}",
           "--profile", "kind=concurrent,streams=1", "--override", "profile.streams", ",".join(map(str, STREAMS)),
           "--constraint", f"kind=max_duration,seconds={args.seconds}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={CHEF}", "--output", f"kind=json,path={out}",
           "--disable-console"]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=len(STREAMS) * (args.seconds + 60) + 120, cwd=out.parent,
                   env=dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"))  # fmt: skip
    return rows_of(out)


def rows_of(out: Path) -> list[dict]:
    """One row per concurrency level, from guidellm's own JSON report."""
    rows = []
    for b in json.loads(out.read_text())["benchmarks"]:
        m = b["metrics"]
        stat = lambda name, key, m=m: _stat(m[name]["successful"], key)  # noqa: E731
        rows.append({
            "streams": b["config"]["strategy"].get("streams"),
            "successful": m["request_totals"]["successful"], "errored": m["request_totals"]["errored"],
            "incomplete": m["request_totals"]["incomplete"],  # still running when the level's time was up
            "requests_per_s": m["requests_per_second"]["successful"]["mean"],
            "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"],
            "output_tokens_p50": stat("output_token_count", "p50"),
            "ttft_ms": {"p50": stat("time_to_first_token_ms", "p50"), "p99": stat("time_to_first_token_ms", "p99")},
            "itl_ms": {"p50": stat("inter_token_latency_ms", "p50"), "p99": stat("inter_token_latency_ms", "p99")},
        })  # fmt: skip
    return rows


def warm_up(url: str) -> None:
    """One order before the sweep, so a server that loads its model at the first request (`transformers
    serve` does) does not spend the first level loading it."""
    import httpx  # lazy: only the warm-up talks HTTP

    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    httpx.post(url + "/v1/completions", json={"model": model, "prompt": "ROMEO:", "max_tokens": 4}, timeout=600)


def _stat(s: dict, key: str) -> float | None:
    """guidellm's median ("p50") or percentile of one metric over the successful requests."""
    return None if not s or s.get("count", 0) == 0 else (s["median"] if key == "p50" else s["percentiles"][key])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "class-server-guidellm.json"))
    ap.add_argument("--seconds", type=int, default=20, help="per concurrency level")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--route", default="/v1/completions")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--render", action="store_true", help="only rewrite the markdown from the JSON at --out")
    args = ap.parse_args()
    if args.render:  # the rows again from guidellm's own reports, where they are still at hand
        report = json.loads(Path(args.out).read_text())
        for name in [n for n in report if n not in ("machine", "load", "notes") and not isinstance(report[n], str)]:
            raw = REPO / "test-artifacts" / f"guidellm-{name.split()[0]}.json"
            report[name] = rows_of(raw) if raw.exists() else report[name]
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text("\n".join(render(json.loads(Path(args.out).read_text()))) + "\n")
        return 0
    logs = REPO / "test-artifacts"
    logs.mkdir(exist_ok=True)
    report: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_before": os.getloadavg()},
                    "load": {"route": args.route, "streams": STREAMS, "seconds_each": args.seconds,
                             "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens}}  # fmt: skip
    servers = {"two-pot-kitchen serve --model chef": [sys.executable, "-m", "serving.http.server", "--model", "chef"]}
    try:
        import fastapi  # noqa: F401  # lazy: transformers serve needs it
    except ImportError:
        args.skip_transformers = True
        report["transformers serve --continuous-batching"] = "skipped: pip install fastapi accelerate to compare"
    if not args.skip_transformers:
        servers["transformers serve --continuous-batching"] = [
            str(Path(sys.executable).parent / "transformers"), "serve", "--host", "127.0.0.1", "--device", "cpu",
            "--continuous-batching", CHEF]  # fmt: skip
    for name, cmd in servers.items():
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start([*cmd, "--port", str(port)], url, "/v1/models", logs / f"guidellm-{name.split()[0]}.log")
        try:
            warm_up(url)
            report[name] = guidellm(url, args.route, args, logs / f"guidellm-{name.split()[0]}.json")
        finally:
            stop(proc)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")  # each server's half as soon as it is done
    report["machine"]["loadavg_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text("\n".join(render(report)) + "\n")
    print(json.dumps(report, indent=1))
    return 0


def render(d: dict) -> list[str]:
    """The markdown report, from the JSON alone."""
    m, load = d["machine"], d["load"]
    f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    lines = [
        "# guidellm against the class kitchen and `transformers serve` (this CPU)",
        "",
        f"Measured {m['date']} by `scripts/guidellm_sweep.py` on this project's {m['cpus']}-core machine, shared with "
        "other work while it ran"
        + (f" (load average {m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after)" if "loadavg_after" in m else "")
        + (f" ({m['note']})" if "note" in m else "")
        + ". The same guidellm command against each server: `--profile concurrent` at "
        f"{', '.join(map(str, load['streams']))} streams, {load['seconds_each']} s each, synthetic prompts of "
        f"{load['prompt_tokens']} tokens, `max_tokens` {load['output_tokens']}, streamed `{load['route']}`, the chef "
        "(float32) on the CPU. Every figure is guidellm's own, copied by the script from its JSON.",
        "",
        "| server | streams | done | errors | unfinished | req/s | output tok/s | output tokens p50 | TTFT p50 / p99 ms | "
        "ITL p50 / p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, rows in d.items():
        if name in ("machine", "load", "notes"):
            continue
        if isinstance(rows, str):
            lines.append(f"| {name} | {rows} ||||||||")
            continue
        for r in rows:
            lines.append(f"| {name} | {r['streams']} | {r['successful']} | {r['errored']} | {r.get('incomplete', '-')} | "
                         f"{r['requests_per_s']:.2f} | "
                         f"{r['output_tokens_per_s']:.1f} | {f(r['output_tokens_p50'], '.0f')} | "
                         f"{f(r['ttft_ms']['p50'], '.1f')} / {f(r['ttft_ms']['p99'], '.1f')} | "
                         f"{f(r['itl_ms']['p50'], '.1f')} / {f(r['itl_ms']['p99'], '.1f')} |")  # fmt: skip
    lines += ["", "Unfinished: requests still in flight when the level's time was up (guidellm cancels them; they "
              "count in no figure)."]  # fmt: skip
    for name, rows in d.items():
        idle = [] if name in ("machine", "load", "notes") or isinstance(rows, str) else [r["streams"] for r in rows if not r["successful"]]
        if idle:
            lines.append(f"- {name} finished no request in {load['seconds_each']} s at "
                         f"{', '.join(map(str, idle))} stream(s): its requests were cancelled unanswered.")  # fmt: skip
    lines += [f"- {note}" for note in d.get("notes", [])]  # measurements added beside the sweep, with their source
    return lines


if __name__ == "__main__":
    sys.exit(main())
