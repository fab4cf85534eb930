"""guidellm's concurrency sweep against the class kitchen and `transformers serve` on the same model.

    .venv/bin/python scripts/guidellm_sweep.py --out docs/benchmarks/class-server-guidellm.json

Starts each server on 127.0.0.1 (ours: `two-pot-kitchen serve --model chef`; theirs: `transformers
serve --continuous-batching` on the same folder), runs the SAME guidellm command against each
(`--profile concurrent`, 1, 2, 4, 8, 16 and 32 streams, each for `--seconds`; synthetic prompts of
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
    rows = []
    for b in json.loads(out.read_text())["benchmarks"]:
        m = b["metrics"]
        stat = lambda name, key, m=m: _stat(m[name]["successful"], key)  # noqa: E731
        rows.append({
            "streams": b["config"]["strategy"].get("streams"),
            "successful": m["request_totals"]["successful"], "errored": m["request_totals"]["errored"],
            "requests_per_s": m["requests_per_second"]["successful"]["mean"],
            "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"],
            "output_tokens_p50": stat("output_token_count", "p50"),
            "ttft_ms": {"p50": stat("time_to_first_token_ms", "p50"), "p99": stat("time_to_first_token_ms", "p99")},
            "itl_ms": {"p50": stat("inter_token_latency_ms", "p50"), "p99": stat("inter_token_latency_ms", "p99")},
        })  # fmt: skip
    return rows


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
    args = ap.parse_args()
    logs = REPO / "test-artifacts"
    logs.mkdir(exist_ok=True)
    report: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_before": os.getloadavg()},
                    "load": {"route": args.route, "streams": STREAMS, "seconds_each": args.seconds,
                             "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens}}  # fmt: skip
    servers = {"two-pot-kitchen serve --model chef": [sys.executable, "-m", "serving.server", "--model", "chef"]}
    try:
        import fastapi  # noqa: F401  -- transformers serve needs it
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
            report[name] = guidellm(url, args.route, args, logs / f"guidellm-{name.split()[0]}.json")
        finally:
            stop(proc)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")  # each server's half as soon as it is done
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
