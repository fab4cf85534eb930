"""Experiment 10, leftovers: a stock made once serves many dishes (prefix caching).

Kitchen words: many orders start the same way: the house stock, the same long base. A kitchen that
keeps yesterday's stock on the counter only cooks each order's own garnish; one that throws it
away boils the stock again for every table. The stock on the counter takes room, so the oldest
pot goes when space is needed.

Engine words: with `Engine.load(..., prefix_cache=True)` a request whose prompt begins with tokens
already in the KV cache (a running sequence's, or a finished one's "leftover" seat) reuses their
K/V and prefills only the rest (engine/prefix_cache.py). Finished seats stay as leftovers until a
seat or memory is needed, oldest first. The hit rate is vLLM's: prompt tokens found cached over
prompt tokens looked up (`ServingState.prefix_queries`, `prefix_hits`); each request reports its
`cached_tokens`.

Measured, two ways:
1. One order, cold and warm (`engine.bench.prefix_reuse.time_reuse`, the benchmark's own measurement):
   for each share of the prompt that is the house prefix, the TTFT of an order on an engine without
   reuse against the same order after a first order with that prefix has finished; the median of
   at least three repeats with their range (drawn as error bars), and "faster" is said only where the
   two ranges do not overlap (`lab.noise.clearly_apart`).
2. A seeded Poisson stream of orders sharing one house prefix, replayed with and without reuse
   (`lab.serve_replay`): each order's TTFT and cached tokens, the hit rate so far, and the KV
   tokens the kitchen holds after every pass (with reuse: running orders + leftovers).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.bench.prefix_reuse import ReuseTiming, time_reuse
from engine.errors import EngineError
from engine.workload import Request
from lab.experiment import Experiment, Prediction, StoryLink
from lab.noise import MIN_REPEATS, SPREAD_LEGEND, Machine, MachineWatch, Spread, clearly_apart, error_bars
from lab.plot_kit import GREY, POT, WOK, finish, guess_marker
from lab.progress import ProgressFn, ProgressTracker
from lab.serve_replay import ReplayResult, replay, serving_engine, warm_up
from lab.serving_verdicts import LEFTOVERS_GOAL, diagnose_leftovers


@dataclass(frozen=True)
class LeftoversSettings:
    prompt_len: int = 400  # tokens of each order's prompt
    shares: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)  # of the prompt that is the cached house prefix
    repeats: int = 5
    orders: int = 16  # orders in the stream
    rate: float = 20.0  # their mean arrivals per second
    stream_share: float = 0.9  # the stream's house prefix, as a share of each prompt
    answer: int = 8  # tokens each order is served
    max_seqs: int = 4  # seats: few, so leftovers are evicted when the line is long
    seed: int = 0


def cold_spread(t: ReuseTiming) -> Spread:
    """The cold TTFT's median and range over the repeats (seconds)."""
    return Spread(t.cold_ttft_s, *t.cold_range_s, t.repeats)


def warm_spread(t: ReuseTiming) -> Spread:
    return Spread(t.warm_ttft_s, *t.warm_range_s, t.repeats)


def reuse_finding(t: ReuseTiming, machine: Machine) -> str:
    """What one share's repeats allow to be said: faster only when cold and warm ranges do not overlap."""
    share = f"with {t.shared_tokens / t.prompt_len:.0%} cached"
    cold, warm = cold_spread(t), warm_spread(t)
    if clearly_apart(cold, warm):
        word = "faster" if warm.median < cold.median else "slower"
        return f"{share}, the order's first token came {word} than cold by more than the repeats vary"
    return machine.too_noisy(f"whether the order is faster {share}")


@dataclass(frozen=True)
class LeftoversOrder:
    """One order of the leftovers stream: its TTFT cooked cold and with the prefix reused."""

    order: int
    arrival_s: float
    cached_tokens: int  # prompt tokens this order reused (with reuse)
    ttft_plain_s: float  # without prefix reuse
    ttft_reuse_s: float
    hit_rate: float  # prompt tokens found cached / looked up, every lookup until this order finished (reuse)


@dataclass(frozen=True)
class LeftoversResult:
    settings: LeftoversSettings
    timings: list[ReuseTiming]  # one per share, smallest share first
    stream: list[LeftoversOrder]
    held: dict[str, list[tuple[float, int]]]  # "with reuse"/"without reuse": (seconds, KV tokens) per pass
    hit_rate: float  # the whole stream's: prompt tokens found cached / looked up (vLLM's definition)
    kv_held_end: int  # KV tokens the reuse engine still holds after the stream: the leftovers alone
    kv_bytes_per_token: int
    notes: list[str]
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    @property
    def most_cached(self) -> ReuseTiming:
        return self.timings[-1]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            [{"shared_share": t.shared_tokens / t.prompt_len, "prompt_tokens": t.prompt_len,
              "shared_tokens": t.shared_tokens, "cold_ttft_s": t.cold_ttft_s, "warm_ttft_s": t.warm_ttft_s,
              "warm_over_cold": t.ratio, "cached_tokens": t.warm_cached_tokens, "repeats": t.repeats,
              "cold_low_s": t.cold_range_s[0], "cold_high_s": t.cold_range_s[1],
              "warm_low_s": t.warm_range_s[0], "warm_high_s": t.warm_range_s[1]} for t in self.timings]
        )  # fmt: skip

    def stream_frame(self) -> pd.DataFrame:
        return pd.DataFrame([vars(o) for o in self.stream])

    def held_frame(self) -> pd.DataFrame:
        """KV memory the kitchen held after each pass of the stream, with and without reuse."""
        return pd.DataFrame(
            [{"reuse": name, "t_s": t, "kv_tokens": n, "kv_mb": n * self.kv_bytes_per_token / 1e6}
             for name, points in self.held.items() for t, n in points]
        )  # fmt: skip


def check(engine, s: LeftoversSettings) -> None:
    """Refuse settings this lesson cannot run, in one line naming the limit."""
    ctx = engine.info.max_context
    if s.prompt_len + max(s.answer, 2) > ctx:
        raise EngineError(
            f"leftovers: prompt {s.prompt_len} + {max(s.answer, 2)} new tokens; the model's context is {ctx}"
        )
    if not s.shares or not all(0 < x < 1 for x in [*s.shares, s.stream_share]):
        raise EngineError("leftovers: every shared share must be between 0 and 1 (0.9 = 90 % of the prompt)")
    if s.prompt_len < 4 or s.repeats < 1 or s.answer < 1 or not s.rate > 0 or s.max_seqs < 1:
        raise EngineError("leftovers: prompt >= 4 tokens, repeats, answer and seats >= 1, rate > 0")
    if not 2 <= s.orders <= 200:
        raise EngineError(f"leftovers: the stream needs 2 to 200 orders (got {s.orders})")


def house_stream(s: LeftoversSettings, vocab: int) -> list[Request]:
    """Orders that all begin with one house prefix and end with their own tail, Poisson arrivals."""
    rng, t = random.Random(s.seed), 0.0
    house = [rng.randrange(vocab) for _ in range(int(s.prompt_len * s.stream_share))]
    out = []
    for _ in range(s.orders):
        t += rng.expovariate(s.rate)
        out.append(
            Request(t, house + [rng.randrange(vocab) for _ in range(s.prompt_len - len(house))], s.answer)
        )
    return out


def serve_stream(
    engine, s: LeftoversSettings, requests: list[Request], reuse: bool
) -> tuple[ReplayResult, int, int]:
    """The stream on a fresh engine; also the prefix counters the warm-up left (subtracted later)."""
    eng = serving_engine(engine, "continuous", max_seqs=s.max_seqs, max_seq_len=s.prompt_len + s.answer,
                         prefix_cache=reuse)  # fmt: skip
    warm_up(eng, engine.info.vocab_size)
    before = eng.serving_state()
    return replay(eng, requests), before.prefix_queries, before.prefix_hits


def run_leftovers(
    engine, settings: LeftoversSettings, on_progress: ProgressFn | None = None
) -> LeftoversResult:
    """Cold against warm for each cached share, then a stream of orders sharing a house prefix."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    s = settings
    check(engine, s)
    shares = sorted(set(s.shares))
    tracker = ProgressTracker([1.0] * len(shares) + [2.0, 2.0], on_progress)
    timings = []
    for share in shares:
        timings.append(time_reuse(engine, s.prompt_len, share, max(MIN_REPEATS, s.repeats), s.seed))
        t = timings[-1]
        tracker.step(
            f"{share:.0%} cached: TTFT {t.warm_ttft_s * 1e3:.1f} vs {t.cold_ttft_s * 1e3:.1f} ms cold"
        )
    requests = house_stream(s, engine.info.vocab_size)
    plain, _, _ = serve_stream(engine, s, requests, reuse=False)
    tracker.step("the stream without reuse")
    warm, q0, h0 = serve_stream(engine, s, requests, reuse=True)
    tracker.step("the stream with reuse")
    stream = [
        LeftoversOrder(i + 1, a, rw.metrics.cached_tokens, rp.metrics.ttft_s, rw.metrics.ttft_s,
                    (sw.prefix_hits - h0) / max(1, sw.prefix_queries - q0))
        for i, (a, rp, rw, sw) in enumerate(zip(warm.arrivals_s, plain.results, warm.results, warm.states,
                                                strict=True))
    ]  # fmt: skip
    held = {name: [(st.end_s, st.kv_tokens_held) for st in served.steps]
            for name, served in (("without reuse", plain), ("with reuse", warm))}  # fmt: skip
    kv_bpt = engine.info.kv_bytes_per_token
    top, end = timings[-1], warm.final
    hit_rate = (end.prefix_hits - h0) / max(1, end.prefix_queries - q0)
    notes = [
        f"with {top.shared_tokens} of {top.prompt_len} prompt tokens cached, TTFT {top.warm_ttft_s * 1e3:.1f} ms "
        f"against {top.cold_ttft_s * 1e3:.1f} ms cold: {top.ratio:.2f}x "
        f"(the goal at 90 %: <= {LEFTOVERS_GOAL}x)",
        f"the stream of {s.orders} orders sharing a {s.stream_share:.0%} house prefix: hit rate {hit_rate:.0%} "
        f"by token; median TTFT {pd.Series([o.ttft_reuse_s for o in stream]).median() * 1e3:.1f} ms with reuse, "
        f"{pd.Series([o.ttft_plain_s for o in stream]).median() * 1e3:.1f} ms without",
        f"after the stream: {end.kv_tokens_used * kv_bpt / 1e6:.2f} MB of KV held by leftovers with reuse, "
        f"{plain.final.kv_tokens_used * kv_bpt / 1e6:.2f} MB without",
    ]
    machine = watch.finish()
    notes[1:1] = [reuse_finding(t, machine) for t in timings]
    return LeftoversResult(s, timings, stream, held, hit_rate, end.kv_tokens_used, kv_bpt, notes, machine)


# -- figures --------------------------------------------------------------------------------------


def leftovers_figures(result: LeftoversResult, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    shares = [f"{x:.0%} cached" for x in df.shared_share]
    cold_warm = go.Figure()
    cold_warm.add_trace(go.Bar(x=shares, y=df.cold_ttft_s * 1e3, name="cold (no reuse)", marker_color=WOK,
                               error_y=error_bars([cold_spread(t) for t in result.timings], 1e3)))  # fmt: skip
    cold_warm.add_trace(go.Bar(x=shares, y=df.warm_ttft_s * 1e3, name="prefix reused", marker_color=POT,
                               error_y=error_bars([warm_spread(t) for t in result.timings], 1e3),
                               text=[f"{r:.2f}x cold" for r in df.warm_over_cold], textposition="outside"))  # fmt: skip
    if guess is not None:
        cold_warm.add_trace(guess_marker(shares[-1], df.cold_ttft_s.iloc[-1] * 1e3 * guess / 100,
                                         f"your guess: {guess:g}% of cold"))  # fmt: skip
    cold_warm.update_yaxes(title="TTFT of the order (ms, median)", rangemode="tozero")
    cold_warm.update_xaxes(title=f"share of the {int(df.prompt_tokens.iloc[0])}-token prompt already cached")
    finish(
        cold_warm,
        f"Leftovers: one order's TTFT, cold vs its prefix cached (goal at 90 %: <= {LEFTOVERS_GOAL}x; {SPREAD_LEGEND})",
    )

    stream = result.stream_frame()
    service = make_subplots(specs=[[{"secondary_y": True}]])
    service.add_trace(go.Scatter(x=stream.order, y=stream.ttft_plain_s * 1e3, name="TTFT without reuse",
                                 mode="lines+markers", line=dict(color=WOK)))  # fmt: skip
    service.add_trace(go.Scatter(x=stream.order, y=stream.ttft_reuse_s * 1e3, name="TTFT with reuse",
                                 mode="lines+markers", line=dict(color=POT)))  # fmt: skip
    service.add_trace(go.Scatter(x=stream.order, y=stream.hit_rate * 100, name="hit rate so far (by token, %)",
                                 mode="lines", line=dict(color=GREY, dash="dash")), secondary_y=True)  # fmt: skip
    service.update_xaxes(title="order in the stream")
    service.update_yaxes(title="TTFT (ms)", type="log", secondary_y=False)
    service.update_yaxes(
        title="hit rate (%)", range=[0, 100], secondary_y=True, showgrid=False, tickmode="auto"
    )
    finish(service, "A stream of orders with one house stock: each order's TTFT and the hit rate")

    memory = go.Figure()
    kv = result.held_frame()
    for name, colour in (("without reuse", WOK), ("with reuse", POT)):
        part = kv[kv.reuse == name]
        memory.add_trace(go.Scatter(x=part.t_s, y=part.kv_mb, name=f"{name} (running orders"
                                    + (" + leftovers)" if name == "with reuse" else ")"),
                                    mode="lines", line=dict(color=colour, shape="hv")))  # fmt: skip
    memory.update_xaxes(title="seconds after the stream began")
    memory.update_yaxes(title="KV cache held after each pass (MB)", rangemode="tozero")
    return [cold_warm, service, finish(memory, "What the leftovers cost: KV memory held during the stream")]


# -- the experiment -------------------------------------------------------------------------------


def leftovers_verdict(result: LeftoversResult, roof=None, dtype: str | None = None):
    top = result.most_cached
    return diagnose_leftovers(top.cold_ttft_s, top.warm_ttft_s, top.shared_tokens / top.prompt_len,
                              result.hit_rate, result.kv_held_end * result.kv_bytes_per_token)  # fmt: skip


def settings_form(ui, info) -> LeftoversSettings:
    most = max(8, info.max_context - 16)
    prompt_len = ui.slider("Prompt of each order (tokens)", 8, most, min(400, most), key="leftovers-prompt")
    shares = ui.multiselect("Shares of the prompt cached", [0.1, 0.25, 0.5, 0.75, 0.9, 0.95],
                            default=[0.25, 0.5, 0.75, 0.9], key="leftovers-shares")  # fmt: skip
    orders = ui.slider("Orders in the stream", 4, 64, 16, key="leftovers-orders")
    seats = ui.slider(
        "Seats at the pot (leftovers are evicted when all are taken)", 1, 16, 4, key="leftovers-seats"
    )
    return LeftoversSettings(
        prompt_len=prompt_len, shares=tuple(shares) or (0.9,), orders=orders, max_seqs=seats
    )


EXPERIMENT = Experiment(
    key="leftovers",
    title="Leftovers: a stock made once serves many dishes",
    nav_title="Leftovers: prefix caching",
    icon=":material/kitchen:",
    kitchen="Most orders tonight start from the same house stock. Keep the stock from the last order on the "
    "counter and the wok only cooks each order's own garnish; pour it away and the whole stock is boiled "
    "again for every table. Kept stock takes counter space, so the oldest pot goes first when room is needed.",
    engineering="With `prefix_cache=True` a prompt that begins with tokens already in the KV cache (a running "
    "or finished sequence's) reuses their keys and values and prefills only the rest. We time one order cold "
    "and with its prefix cached, then replay a stream of orders sharing a prefix with and without reuse: "
    "TTFT, hit rate by token (vLLM's definition) and the KV memory the leftovers hold.",
    predict=Prediction(
        question="With most of its prompt cached (90 % by default), what % of the cold TTFT will the order take?",
        unit="%",
        min_value=0.0,
        max_value=200.0,
        step=5.0,
        answer=lambda r: r.most_cached.ratio * 100,
    ),
    form=settings_form,
    run=run_leftovers,
    figures=leftovers_figures,
    record=lambda info: LeftoversSettings(prompt_len=min(400, info.max_context - 16)),
    story=StoryLink(
        ":material/kitchen: The house stock kept on the counter",
        "**Prefix caching**: requests that share the start of their prompt (a system prompt) reuse its cached "
        "keys and values, so prefill computes only the new part; finished sequences are kept until evicted.",
        "Lab: leftovers (prefix caching)",
    ),
    tables=lambda r: {"reuse": r.to_frame(), "stream": r.stream_frame(), "memory": r.held_frame()},
    verdict=leftovers_verdict,
    verdict_on=lambda r: (
        f"one {r.settings.prompt_len}-token order cold and warm, and a stream of {r.settings.orders}"
    ),
)
