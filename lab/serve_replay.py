"""A stream of orders through the engine's serving core, with every step kept: the serving labs' stopwatch.

Why not `engine.bench.serve_bench.replay` as it is: it keeps only each request's result, and the serving
labs also draw the stove itself: which tickets each step held and how many of its tokens were the
wok's (prefill) or the pot's (decode). So this replays the same kind of stream (the benchmark's
`Request` list, from its seeded `make_requests`) the same way, in real time, submitting each
order with its planned arrival so a step in progress counts as queue time, and keeps every
`StepEnd` with the step's start and end on the replay's own clock (seconds after the start).

`serving_engine` builds a second engine on the same weights with other serving settings, as the
benchmark does: one model in memory, one engine per policy.

Example:
    eng = serving_engine(base, "continuous", token_budget=512, max_seqs=16)
    served = replay(eng, make_requests(20, 30.0, Dist("fixed", (32,)), Dist("fixed", (16,)), 0, vocab))
    served.results[0].metrics.ttft_s, served.steps[0].prefill_tokens
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.engine import Engine, ServingState
from engine.events import Done, StepEnd
from engine.results import RequestOutput
from engine.workload import Request


@dataclass(frozen=True)
class StepSpan:
    """One pass of the stove: when it ran, which tickets it held, whose tokens went in."""

    start_s: float  # seconds after the replay's start
    end_s: float
    request_ids: tuple[int, ...]  # positions in the request list (0 = the first order)
    prefill_tokens: int  # the wok's share of the pass
    decode_tokens: int  # the pot's share
    kv_tokens_held: int  # cached tokens held after the pass: running sequences' and leftovers'

    @property
    def phase(self) -> str:
        """ "prefill" or "decode" alone, or "mixed" when one pass held both (chunked prefill)."""
        if self.prefill_tokens and self.decode_tokens:
            return "mixed"
        return "prefill" if self.prefill_tokens else "decode"


@dataclass(frozen=True)
class ReplayResult:
    """What one replay measured. Lists follow the request list's order."""

    arrivals_s: list[float]  # planned arrival, seconds after the start
    results: list[RequestOutput]
    steps: list[StepSpan]
    states: list[ServingState]  # the kitchen's gauges right after each request finished
    final: ServingState  # the gauges once every request has finished
    span_s: float  # first arrival to last finish (the benchmark's duration)


def serving_engine(
    base: Engine,
    policy: str,
    *,
    token_budget: int = 512,
    max_seqs: int = 16,
    max_seq_len: int | None = None,
    prefix_cache: bool = False,
) -> Engine:
    """An engine on `base`'s weights with these serving settings (refused in one line when invalid)."""
    settings = base.settings.but(policy=policy, token_budget=token_budget, max_seqs=max_seqs, max_seq_len=max_seq_len,
                                 prefix_cache=prefix_cache)  # fmt: skip
    return Engine(base.model, base.codec, base.info, settings)


def replay(engine: Engine, requests: list[Request]) -> ReplayResult:
    """Submit each request when its time comes (EOS ignored: exact output lengths), step while there is work."""
    ids: list[int] = []  # the engine's id of each request, in list order
    where: dict[int, int] = {}  # engine id -> position in the list
    done: dict[int, tuple[RequestOutput, ServingState]] = {}
    steps: list[StepSpan] = []
    t0 = time.perf_counter()
    while len(ids) < len(requests) or not engine.idle:
        now = time.perf_counter() - t0
        while len(ids) < len(requests) and requests[len(ids)].arrival_s <= now:
            r = requests[len(ids)]
            ids.append(
                engine.submit(r.prompt, r.max_new_tokens, stop_at_eos=False, arrival_s=t0 + r.arrival_s)
            )
            where[ids[-1]] = len(ids) - 1
        if engine.idle:
            time.sleep(max(0.0, requests[len(ids)].arrival_s - (time.perf_counter() - t0)))
            continue
        start = time.perf_counter() - t0
        events = engine.step()
        end = time.perf_counter() - t0
        state = engine.serving_state()
        for ev in events:
            if isinstance(ev, StepEnd):
                held = tuple(where[i] for i in ev.request_ids)
                steps.append(
                    StepSpan(start, end, held, ev.prefill_tokens, ev.decode_tokens, state.kv_tokens_used)
                )
            elif isinstance(ev, Done):
                done[where[ev.request_id]] = (ev.result, state)
    results = [done[i][0] for i in range(len(requests))]
    last = max(r.arrival_s + res.metrics.e2e_s for r, res in zip(requests, results, strict=True))
    return ReplayResult(
        arrivals_s=[r.arrival_s for r in requests],
        results=results,
        steps=steps,
        states=[done[i][1] for i in range(len(requests))],
        final=engine.serving_state(),
        span_s=last - requests[0].arrival_s,
    )


def warm_up(engine: Engine, vocab_size: int) -> None:
    """A few tiny orders first, so first-call costs (allocator, kernels' workspaces) stay out of the numbers."""
    replay(engine, [Request(0.0, [(7 * i + 1) % vocab_size for i in range(8)], 4) for _ in range(4)])
