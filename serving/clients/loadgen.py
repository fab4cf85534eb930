"""A bounded load generator: N simulated students ordering from an OpenAI-compatible server.

    python -m serving.clients.loadgen --url http://127.0.0.1:8000 --model chef --students 30 \\
        --requests 90 --rate 15 --prompt-len uniform:8:64 --max-tokens 32 --verify --json

Each request is a streamed /v1/completions with a seeded random prompt (token ids, or words with
`--prompt-kind text` for servers that take only text), greedy, sent at
a seeded Poisson arrival time, with at most `--students` requests in flight (a student waits for
an answer before ordering again). Everything is measured at the client, from the stream:

  TTFT  request sent -> first chunk with text      ITL   gaps between chunks with text
  TPOT  (last - first chunk) / (chunks - 1)        E2E   request sent -> [DONE]

`--verify` then sends every prompt again, one at a time, and checks that each answer served in
the crowd equals the same prompt served alone: no lost, mixed-up or altered streams. Goodput
counts the requests that met `--slo-ttft` and `--slo-tpot`. Bounded: `--requests` (at most
10,000) and `--timeout` seconds for the whole run; loopback addresses only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

from engine.errors import EngineError
from engine.workload import Dist, percentiles

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
WORDS = ("the", "king", "queen", "night", "love", "sweet", "good", "lord", "what", "shall", "come", "speak",
         "heart", "death", "fair", "hath", "thou", "thee", "my", "soul", "Romeo", "Juliet", "sir", "gentle")  # fmt: skip


@dataclass
class Outcome:
    prompt: list[int] | str
    text: str = ""
    sent: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    done: float | None = None
    error: str | None = None
    status: int | None = None  # the HTTP status of the answer
    retry_after: str | None = None  # a refusal's Retry-After header
    answered: float | None = None  # when the status line arrived (a refusal's whole answer)


@dataclass(frozen=True)
class LoadReport:
    requests: int
    errors: int
    error_lines: list[str]
    mismatches: int | None  # None without --verify
    duration_s: float
    requests_per_s: float
    ttft_s: dict
    itl_s: dict
    tpot_s: dict
    e2e_s: dict
    goodput: float
    slo_met: int


async def order(http: httpx.AsyncClient, url: str, model: str, prompt, max_tokens: int, out: Outcome) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    out.sent = time.perf_counter()
    try:
        async with http.stream("POST", url + "/v1/completions", json=body) as r:
            out.status, out.answered, out.retry_after = r.status_code, time.perf_counter(), r.headers.get("retry-after")
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return
            finished = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out.done = time.perf_counter()
                    return
                ev = json.loads(line[6:])
                if "error" in ev:
                    out.error = ev["error"]["message"]
                    return
                text = "".join(c.get("text", "") for c in ev.get("choices", []))
                finished = finished or any(c.get("finish_reason") for c in ev.get("choices", []))
                if text:
                    out.chunk_times.append(time.perf_counter())
                    out.text += text
        if finished:  # some servers (transformers serve) end the stream without `data: [DONE]`
            out.done = time.perf_counter()
            return
        out.error = out.error or "the stream ended before its last chunk"
    except httpx.HTTPError as err:
        out.error = f"{type(err).__name__}: {err}"


async def run_load(url: str, model: str, prompts: list, arrivals: list[float], students: int,
                   max_tokens: int, api_key: str | None, timeout_s: float) -> list[Outcome]:  # fmt: skip
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    seats = asyncio.Semaphore(students)
    outcomes = [Outcome(p) for p in prompts]
    limits = httpx.Limits(max_connections=students + 4)
    async with httpx.AsyncClient(headers=headers, timeout=timeout_s, limits=limits) as http:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
            async with seats:
                await order(http, url, model, prompts[i], max_tokens, outcomes[i])

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
        _, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in late:  # never a hang: a request still open at the bound is an error that says so
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for i, task in enumerate(tasks):
            if task in late and outcomes[i].error is None:
                outcomes[i].error = (f"no whole answer within the load's bound of {timeout_s:g} s "
                                     f"({len(outcomes[i].chunk_times)} chunks had arrived)")  # fmt: skip
    return outcomes


async def serve_alone(url: str, model: str, prompts: list, max_tokens: int, api_key: str | None,
                      timeout_s: float) -> list[Outcome]:  # fmt: skip
    """The same prompts, one at a time: each alone in the kitchen."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    outs = []
    async with httpx.AsyncClient(headers=headers, timeout=timeout_s) as http:
        for p in prompts:
            outs.append(Outcome(p))
            await order(http, url, model, p, max_tokens, outs[-1])
    return outs


def summarize(outcomes: list[Outcome], alone: list[Outcome] | None, slo_ttft: float, slo_tpot: float) -> LoadReport:
    ok = [o for o in outcomes if o.error is None and o.done is not None]
    ttft = [o.chunk_times[0] - o.sent for o in ok if o.chunk_times]
    itl = [b - a for o in ok for a, b in zip(o.chunk_times, o.chunk_times[1:], strict=False)]
    tpot = [(o.chunk_times[-1] - o.chunk_times[0]) / (len(o.chunk_times) - 1) for o in ok if len(o.chunk_times) > 1]
    met = [o for o in ok if o.chunk_times and o.chunk_times[0] - o.sent <= slo_ttft and (
        len(o.chunk_times) < 2 or (o.chunk_times[-1] - o.chunk_times[0]) / (len(o.chunk_times) - 1) <= slo_tpot)]  # fmt: skip
    start = min((o.sent for o in outcomes), default=0.0)
    end = max((o.done for o in ok), default=start)
    span = max(end - start, 1e-9)
    mismatches = None if alone is None else sum(
        o.error is None and (a.error is not None or a.text != o.text) for o, a in zip(outcomes, alone, strict=True)
    )  # fmt: skip
    errors = [o.error for o in outcomes if o.error is not None]
    return LoadReport(
        requests=len(outcomes), errors=len(errors), error_lines=sorted(set(errors))[:5], mismatches=mismatches,
        duration_s=span, requests_per_s=len(ok) / span, ttft_s=percentiles(ttft), itl_s=percentiles(itl),
        tpot_s=percentiles(tpot), e2e_s=percentiles([o.done - o.sent for o in ok]), goodput=len(met) / span,
        slo_met=len(met),
    )  # fmt: skip


def rss_kb(pid: int) -> int:
    """Resident memory of `pid` and all its descendants (a server and its engine process), kB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:")))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            pass
    return total


def make_load(n: int, rate: float, prompt_len: Dist, seed: int, vocab: int, kind: str = "ids") -> tuple[list, list[float]]:
    """Seeded prompts (token ids, or that many words for `kind="text"`) and Poisson arrival times."""
    rng, t, prompts, arrivals = random.Random(seed), 0.0, [], []
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
        length = prompt_len.draw(rng)
        if kind == "text":
            prompts.append(" ".join(rng.choice(WORDS) for _ in range(length)))
        else:
            prompts.append([rng.randrange(vocab) for _ in range(length)])
    return prompts, arrivals


def build_parser() -> argparse.ArgumentParser:
    from engine.errors import OneLineParser  # lazy: the command line only

    p = OneLineParser(prog="python -m serving.clients.loadgen", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="chef")
    p.add_argument("--api-key", default=None)
    p.add_argument("--students", type=int, default=30, help="requests in flight at most")
    p.add_argument("--requests", type=int, default=90)
    p.add_argument("--rate", type=float, default=15.0, help="mean arrivals per second (Poisson)")
    p.add_argument("--prompt-len", default="uniform:8:64")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--vocab", type=int, default=2048, help="token ids are drawn below this")
    p.add_argument("--prompt-kind", default="ids", choices=["ids", "text"], help="text: words, for text-only servers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, default=1.0)
    p.add_argument("--slo-tpot", type=float, default=0.1)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--verify", action="store_true", help="check each answer against the prompt served alone")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        if urlparse(args.url).hostname not in LOOPBACK:
            raise EngineError(f"--url must be a loopback address ({', '.join(LOOPBACK[:3])}); got {args.url}")
        if not 1 <= args.requests <= 10_000 or not 1 <= args.students <= 1000 or not args.rate > 0:
            raise EngineError("--requests must be 1..10,000, --students 1..1,000 and --rate > 0")
        prompts, arrivals = make_load(args.requests, args.rate, Dist.parse(args.prompt_len, "--prompt-len"),
                                      args.seed, args.vocab, args.prompt_kind)  # fmt: skip
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    outcomes = asyncio.run(run_load(args.url, args.model, prompts, arrivals, args.students, args.max_tokens,
                                    args.api_key, args.timeout))  # fmt: skip
    alone = None
    if args.verify:
        alone = asyncio.run(serve_alone(args.url, args.model, prompts, args.max_tokens, args.api_key, args.timeout))
    report = summarize(outcomes, alone, args.slo_ttft, args.slo_tpot)
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        ms = lambda d: "/".join("-" if d[k] is None else f"{d[k] * 1e3:.1f}" for k in ("p50", "p90", "p99"))  # noqa: E731
        print(f"{report.requests} requests, {report.errors} errors, mismatches {report.mismatches}, "
              f"{report.requests_per_s:.2f} req/s; TTFT p50/p90/p99 {ms(report.ttft_s)} ms; "
              f"ITL {ms(report.itl_s)} ms; TPOT {ms(report.tpot_s)} ms; goodput {report.goodput:.2f}/s")  # fmt: skip
    return 0 if report.errors == 0 and not report.mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
