"""serve-bench: a seeded Poisson stream of orders over the real engine, every policy on the same list.

    python -m engine serve-bench --model chef --policy all --rate 40 --requests 200 \\
        --prompt-len uniform:16:96 --output-len uniform:16:64 --seed 0 --json

What it does, per policy: load nothing new (the weights are shared), build an engine with that
policy, warm it up, then replay the request list in real time: each request is submitted when
its arrival time has passed (its arrival is the planned time, so a step in progress when it
arrives counts as queue time), and `step()` runs whenever there is work. Output lengths are
exact (EOS ignored, as vLLM's benchmark does), so every policy does the same work.

Reported (vLLM's definitions, engine/results.py): requests/s and output tokens/s over the span
from the first arrival to the last finish; TTFT, TPOT and ITL at p50 / p90 / p99; goodput, the
requests per second that met the SLO (`--slo-ttft`, `--slo-tpot`). Ratios: continuous vs static
requests/s, chunked vs continuous p99 ITL.

`--decode-step 1,32` also times one decode step of the serving path against the fixed-batch
path at those batch sizes (engine/bench/decode_step.py); `--policy none` runs only that.

Lengths are distributions: `64` (fixed), `uniform:16:128`, or `choice:32,32,32,448` (one drawn
at random per request: a mix of short orders and the odd banquet).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch

from engine.bench.decode_step import time_decode_step
from engine.engine import Engine
from engine.errors import EngineError, OneLineParser
from engine.events import Done
from engine.results import RequestOutput
from engine.scheduler import POLICIES
from engine.workload import Dist, Request, make_requests, percentiles


@dataclass(frozen=True)
class PolicyReport:
    requests: int
    duration_s: float
    requests_per_s: float
    tokens_per_s: float
    ttft_s: dict
    tpot_s: dict
    itl_s: dict
    queue_s: dict
    goodput: float  # requests per second that met the SLO
    slo_met: int
    preemptions: int
    steps: int


def replay(engine: Engine, requests: list[Request]) -> tuple[list[RequestOutput], float, int]:
    """Submit each request when its time comes, step whenever there is work. Returns the results,
    the span from the first arrival to the last finish, and the number of steps."""
    results, steps, i = [], 0, 0
    t0 = time.perf_counter()
    while i < len(requests) or not engine.idle:
        now = time.perf_counter() - t0
        while i < len(requests) and requests[i].arrival_s <= now:
            r = requests[i]
            engine.submit(r.prompt, r.max_new_tokens, stop_at_eos=False, arrival_s=t0 + r.arrival_s)
            i += 1
        if engine.idle:
            time.sleep(max(0.0, requests[i].arrival_s - (time.perf_counter() - t0)))
            continue
        results += [ev.result for ev in engine.step() if isinstance(ev, Done)]
        steps += 1
    last = max(r.metrics.e2e_s + t0 + q.arrival_s for r, q in zip(_by_id(results), requests, strict=True))
    return _by_id(results), last - (t0 + requests[0].arrival_s), steps


def _by_id(results: list[RequestOutput]) -> list[RequestOutput]:
    return sorted(results, key=lambda r: r.request_id)


def report(results: list[RequestOutput], span_s: float, steps: int, slo_ttft: float, slo_tpot: float) -> PolicyReport:
    ms = [r.metrics for r in results]
    met = [m for m in ms if m.ttft_s <= slo_ttft and (m.tpot_s is None or m.tpot_s <= slo_tpot)]
    return PolicyReport(
        requests=len(ms), duration_s=span_s, requests_per_s=len(ms) / span_s,
        tokens_per_s=sum(m.output_tokens for m in ms) / span_s,
        ttft_s=percentiles([m.ttft_s for m in ms]),
        tpot_s=percentiles([m.tpot_s for m in ms if m.tpot_s is not None]),
        itl_s=percentiles([x for m in ms for x in m.itl_s]),
        queue_s=percentiles([m.queue_s for m in ms]),
        goodput=len(met) / span_s, slo_met=len(met), preemptions=sum(m.preemptions for m in ms), steps=steps,
    )  # fmt: skip


def run_policy(base: Engine, policy: str, requests: list[Request], args) -> PolicyReport:
    settings = base.settings.but(policy=policy, token_budget=args.token_budget, max_seqs=args.max_seqs,
                                 max_seq_len=args.max_seq_len)  # fmt: skip
    engine = Engine(base.model, base.codec, base.info, settings)
    warm = make_requests(4, 1e9, Dist("fixed", (8,)), Dist("fixed", (4,)), 1, base.cfg.vocab_size)
    replay(engine, warm)  # first-call costs (allocator, kernels' workspaces) stay out of the numbers
    results, span, steps = replay(engine, [Request(r.arrival_s, r.prompt, r.max_new_tokens) for r in requests])
    return report(results, span, steps, args.slo_ttft, args.slo_tpot)


def ratios(reports: dict[str, PolicyReport]) -> dict[str, float]:
    out = {}
    if "continuous" in reports and "static" in reports:
        out["continuous_vs_static_requests_per_s"] = (
            reports["continuous"].requests_per_s / reports["static"].requests_per_s
        )
    if "chunked" in reports and "continuous" in reports:
        out["chunked_vs_continuous_itl_p99"] = reports["chunked"].itl_s["p99"] / reports["continuous"].itl_s["p99"]
    return out


def build_parser() -> argparse.ArgumentParser:

    p = OneLineParser(prog="python -m engine serve-bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="chef")
    p.add_argument("--policy", default="all", help="static | continuous | chunked | all | none")
    p.add_argument("--decode-step", default="", help="batch sizes, e.g. 1,32: time a decode step on both paths")
    p.add_argument("--decode-repeats", type=int, default=5, help="rounds of the decode-step timing (median kept)")
    p.add_argument("--rate", type=float, default=20.0, help="mean arrivals per second (Poisson)")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--prompt-len", default="uniform:16:96")
    p.add_argument("--output-len", default="uniform:16:64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--max-seqs", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--slo-ttft", type=float, default=1.0, help="seconds")
    p.add_argument("--slo-tpot", type=float, default=0.1, help="seconds")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    return p


def check(args) -> list[str]:
    policies = {"all": list(POLICIES), "none": []}.get(args.policy, [args.policy])
    if any(p not in POLICIES for p in policies):
        raise EngineError(f"--policy '{args.policy}' is not one of {', '.join(POLICIES)}, all, none")
    if not args.rate > 0:
        raise EngineError(f"--rate must be > 0 requests per second (got {args.rate})")
    if not 1 <= args.requests <= 100_000:
        raise EngineError(f"--requests must be between 1 and 100,000 (got {args.requests})")
    if args.slo_ttft <= 0 or args.slo_tpot <= 0:
        raise EngineError("--slo-ttft and --slo-tpot must be > 0 seconds")
    if args.threads is not None and args.threads < 1:
        raise EngineError(f"--threads must be at least 1 (got {args.threads})")
    return policies


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    policies = check(args)
    prompt_len, output_len = Dist.parse(args.prompt_len, "--prompt-len"), Dist.parse(args.output_len, "--output-len")
    if args.threads:

        torch.set_num_threads(args.threads)
    try:
        batches = [int(b) for b in args.decode_step.split(",") if b.strip()]
    except ValueError:
        raise EngineError(f"--decode-step must be comma-separated batch sizes (got '{args.decode_step}')") from None
    if any(b < 1 or b > args.max_seqs for b in batches):
        raise EngineError(f"--decode-step batch sizes must be between 1 and --max-seqs {args.max_seqs}")
    if not 1 <= args.decode_repeats <= 100:
        raise EngineError(f"--decode-repeats must be between 1 and 100 (got {args.decode_repeats})")
    base = Engine.load(args.model, device=args.device, dtype=args.dtype, policy="continuous",
                       token_budget=args.token_budget, max_seqs=args.max_seqs, max_seq_len=args.max_seq_len)  # fmt: skip
    seat = base.serving_limits().seat_len
    if prompt_len.largest + output_len.largest > seat:
        raise EngineError(
            f"the longest prompt + output ({prompt_len.largest + output_len.largest:,} tokens) exceeds a KV seat "
            f"of {seat:,} tokens (--max-seq-len, up to the model's context of {base.cfg.max_context:,})"
        )
    requests = make_requests(args.requests, args.rate, prompt_len, output_len, args.seed, base.cfg.vocab_size)
    reports = {p: run_policy(base, p, requests, args) for p in policies}
    steps = [time_decode_step(base, b, repeats=args.decode_repeats) for b in batches]
    out = {
        "model": base.info.name, "device": args.device, "dtype": args.dtype, "rate": args.rate,
        "requests": args.requests, "prompt_len": args.prompt_len, "output_len": args.output_len, "seed": args.seed,
        "token_budget": args.token_budget, "slo": {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot},
        "policies": {p: asdict(r) for p, r in reports.items()}, "ratios": ratios(reports),
        "decode_step": [asdict(t) | {"ratio": t.ratio, "order_ratio": t.order_ratio, "aa_ratio": t.aa_ratio} for t in steps],
    }  # fmt: skip
    if args.json:
        print(json.dumps(out))
    else:
        print(format_table(out))
    return 0


def format_table(out: dict) -> str:
    ms = lambda d, k: "-" if d[k] is None else f"{d[k] * 1e3:.1f}"  # noqa: E731
    lines = [f"{out['model']} on {out['device']} {out['dtype']}: {out['requests']} requests at {out['rate']}/s",
             f"{'policy':<11} {'req/s':>7} {'tok/s':>8} {'TTFT p50/p99 ms':>17} {'TPOT p50 ms':>12} "
             f"{'ITL p50/p99 ms':>16} {'goodput':>8}"]  # fmt: skip
    for name, r in out["policies"].items():
        lines.append(
            f"{name:<11} {r['requests_per_s']:>7.2f} {r['tokens_per_s']:>8.1f} "
            f"{ms(r['ttft_s'], 'p50') + '/' + ms(r['ttft_s'], 'p99'):>17} {ms(r['tpot_s'], 'p50'):>12} "
            f"{ms(r['itl_s'], 'p50') + '/' + ms(r['itl_s'], 'p99'):>16} {r['goodput']:>8.2f}"
        )
    lines += [f"{k}: {v:.2f}" for k, v in out["ratios"].items()]
    lines += [f"decode step at batch {t['batch']}: fixed {t['fixed_ms']:.2f} ms, serving {t['serving_ms']:.2f} ms "
              f"(x{t['ratio']:.3f}), an order on seats {t['order_ms']:.2f} ms (x{t['order_ratio']:.3f}); "
              f"fixed against itself x{t['aa_ratio']:.3f}" for t in out["decode_step"]]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
