"""Experiment 1, the big banquet: how the wok's time (TTFT) grows with the size of the order.

Kitchen words: a birthday banquet is a whole table's worth of ingredients in one wok. Same wok, same
heat, but the toss takes longer; at first the wok just gets fuller (more tokens per pass, same
cost per token), until it is full and each extra ingredient adds its full cost, plus a growing
share of mixing every ingredient with every other (attention).

Engine words: prefill processes the L prompt tokens in one forward pass. Its matmuls cost ~2 x
params FLOPs per token (linear in L); attention's QK^T and AV cost ~4 x L x d per token per layer
(so L^2 in total). On a machine with idle parallel units, short prompts under-use it and tokens/s
*rises* with L; once the units are busy, tokens/s flattens: the wok is saturated. At long L,
attention's quadratic share bends TTFT upward and tokens/s falls.

Measured: for each prompt length, `repeats` (at least 3) single-token generations
(max_new_tokens=1): TTFT, prefill pass time (wall) and prefill CPU time (`lab.cpu_time`), each
kept as the median with the repeats' range (`lab.noise.Spread`), drawn as error bars. The
saturation mark is the first length whose prefill rate reaches `SATURATION` (90 %) of the best; it
is stated only when the rise to it is larger than the repeats' spread (`saturation_point`), else
the result says it is too noisy to tell, and how busy the machine was.

Analytic (not measured, labelled so): attention's share of the prefill FLOPs, from the engine's cost
model for this model's shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.costs import step_cost
from lab.cpu_time import generate_timed
from lab.experiment import Experiment, Prediction, StoryLink
from lab.noise import (
    MIN_REPEATS,
    SPREAD_LEGEND,
    Machine,
    MachineWatch,
    Spread,
    clearly_apart,
    error_bars,
    spread_of,
)
from lab.plot_kit import GREY, WOK, cpu_time_line, finish, guess_marker, mark_x, series
from lab.progress import ProgressFn, ProgressTracker
from lab.sample import Sample, sample_of
from lab.workload import check_fits, prompt_ids

MAX_SWEEP = 2048  # longer prompts exist on big presets, but a class demo should finish in minutes
SATURATION = 0.9  # the wok is "saturated" once tokens/s is within 10 % of the best seen


@dataclass(frozen=True)
class BanquetSettings:
    lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 511)  # + 1 new token: fits the smallest catalog context (512)
    repeats: int = 3


@dataclass(frozen=True)
class BanquetPoint:
    prompt_tokens: int
    ttft_s: float  # median over repeats
    prefill_s: float  # median prefill pass (wall, the whole step)
    prefill_tps: float  # prompt tokens per second of the prefill pass
    prefill_cpu_s: float  # median process CPU time of the prefill (see lab/cpu_time.py)
    us_per_token: float  # prefill time per prompt token, microseconds
    attention_share: float  # analytic share of prefill FLOPs spent in attention's L x L work
    flops: float  # analytic FLOPs of the prefill pass
    ttft: Spread  # seconds: median and range of the repeats
    rate: Spread  # the rate that decides saturation (tokens per CPU-second on a CPU, else tokens/s)


@dataclass(frozen=True)
class BanquetResult:
    settings: BanquetSettings
    points: list[BanquetPoint]
    saturation_tokens: int | None  # where the wok saturates; None when the spread does not allow saying
    sample: Sample
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"  # CPU time is the work's own cost only when the work runs on the CPU
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for p in self.points:
            row = {k: v for k, v in asdict(p).items() if k not in ("ttft", "rate")}
            row.update(ttft_low_s=p.ttft.low, ttft_high_s=p.ttft.high, repeats=p.ttft.n)
            rows.append(row)
        return pd.DataFrame(rows)


def attention_share(cfg, length: int) -> float:
    """Analytic fraction of a prefill's FLOPs spent in attention scores and mixing (QK^T and PV).

    Uses the engine's own cost model (`engine.costs.step_cost`) twice: with the causal (query,
    key) pair count L(L+1)/2, and with none; the difference is attention's part. It grows with L
    because every token attends to every earlier one: L^2 / 2 pairs against L tokens of matmuls.
    """

    def cost(pairs: int) -> float:
        return step_cost(cfg, 1, length, length, 4, logits_rows=1, attn_pairs=pairs).flops

    total = cost(length * (length + 1) // 2)
    return 1 - cost(0) / total if total > 0 else 0.0


def saturation_point(points: list[BanquetPoint]) -> int | None:
    """The first prompt length whose rate is within 10 % of the best: the wok is full. None when the
    repeats' spread does not allow saying so.

    The rate is `BanquetPoint.rate`: on a CPU tokens per CPU-second (the work's own rate, so a
    neighbour's burst during one length moves it less), elsewhere wall-clock tokens/s. The mark
    stands only where the rise to it is real: the length just before it must be clearly slower than
    the best (their ranges apart). Full from the shortest prompt stands only when every point's range
    is within 10 % of its median (a flat curve, not a noisy one).
    Example: rates 2k, 5k (4.8-5.2k), 5.1k (4.9-5.3k) -> 64 (the second); 2k-6k, 5k, 5k -> None.
    """
    if not points:
        return None
    rates = [p.rate for p in points]
    best = max(rates, key=lambda r: r.median)
    i = next(i for i, r in enumerate(rates) if r.median >= SATURATION * best.median)
    if i > 0:
        return points[i].prompt_tokens if clearly_apart(rates[i - 1], best) else None
    flat = all(r.high - r.low <= (1 - SATURATION) * r.median for r in rates)
    return points[0].prompt_tokens if flat else None


def measure_length(engine, length: int, repeats: int, on_cpu: bool) -> tuple[BanquetPoint, Sample]:
    ids = prompt_ids(engine, length)
    engine.generate([ids], max_new_tokens=1, stop_at_eos=False)  # warm-up: a GPU's first call of a new shape is slow (lazy init, kernel choice), so it is not timed
    timed = [
        generate_timed(engine, [ids], max_new_tokens=1, temperature=0.0, stop_at_eos=False)
        for _ in range(repeats)
    ]
    runs = [t.result for t in timed]
    wall = spread_of([r.trace.prefill.seconds for r in runs])
    cpu = spread_of([t.prefill_cpu_s for t in timed])
    ttft = spread_of([r.metrics.ttft_s for r in runs])
    prefill_s = wall.median
    point = BanquetPoint(
        prompt_tokens=length,
        ttft_s=ttft.median,
        prefill_s=prefill_s,
        prefill_tps=length / prefill_s if prefill_s > 0 else 0.0,
        us_per_token=prefill_s / length * 1e6,
        prefill_cpu_s=cpu.median,
        attention_share=attention_share(engine.cfg, length),
        flops=runs[0].trace.prefill.flops,
        ttft=ttft,
        rate=(cpu if on_cpu and cpu.low > 0 else wall).inverse(length),
    )
    return point, sample_of(runs[-1], f"prompt {length} tokens")


def run_banquet(engine, settings: BanquetSettings, on_progress: ProgressFn | None = None) -> BanquetResult:
    """TTFT and prefill tokens/s for each prompt length, shortest first."""
    lengths = sorted(set(settings.lengths))
    for n in lengths:
        check_fits(engine, n, 1, "big banquet")
    repeats = max(MIN_REPEATS, settings.repeats)
    tracker = ProgressTracker([n * repeats for n in lengths], on_progress)
    watch = MachineWatch()
    engine.generate([prompt_ids(engine, lengths[0])], max_new_tokens=1, stop_at_eos=False)  # warm-up
    on_cpu = str(engine.info.device).startswith("cpu")
    points, sample = [], None
    for n in lengths:
        point, sample = measure_length(engine, n, repeats, on_cpu)
        points.append(point)
        tracker.step(f"prompt {n} tokens: time to the first dish {point.ttft_s * 1e3:.1f} ms")
    machine = watch.finish()
    sat = saturation_point(points)
    full = (f"the wok's speed (prompt tokens per second) reaches {SATURATION:.0%} of its best at {sat} "
            "prompt tokens, by more than the repeats vary: the wok is full from there")
    notes = [
        full if sat else machine.too_noisy("where the wok is full"),
        f"mixing every ingredient with every other (attention) grows from {points[0].attention_share:.0%} "
        f"of the work at {points[0].prompt_tokens} tokens to {points[-1].attention_share:.0%} "
        f"at {points[-1].prompt_tokens} (computed from the model's shape, not measured)",
    ]
    return BanquetResult(
        settings=settings,
        points=points,
        saturation_tokens=sat,
        sample=sample,
        notes=notes,
        device=str(engine.info.device),
        machine=machine,
    )


# -- figures --------------------------------------------------------------------------------------


def banquet_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    ttfts = [p.ttft for p in result.points]
    ttft = go.Figure(series(df.prompt_tokens, df.ttft_s * 1e3, f"time to the first dish, median ({SPREAD_LEGEND})",
                            WOK, spread=error_bars(ttfts, 1e3)))
    if result.device == "cpu":
        ttft.add_trace(cpu_time_line(df.prompt_tokens, df.prefill_cpu_s * 1e3,
                                     "the wok's own work (CPU time), median", WOK))
    if guess is not None:
        ttft.add_trace(
            guess_marker(
                df.prompt_tokens.iloc[-1], df.ttft_s.iloc[0] * 1e3 * guess, f"your guess: {guess:g}x",
                "top left")
        )
    if result.saturation_tokens:
        mark_x(ttft, result.saturation_tokens, "the wok is full", log_x=True)
    ttft.update_xaxes(title="prompt tokens", type="log")
    ttft.update_yaxes(title="time to the first dish (ms)", type="log")
    finish(ttft, "The big banquet: time to the first dish vs the size of the order")

    rates = [p.rate for p in result.points]
    on_cpu = result.device == "cpu"
    rate = make_subplots(specs=[[{"secondary_y": True}]])
    rate.add_trace(series(df.prompt_tokens, [r.median for r in rates],
                          f"prompt tokens per {'CPU-' if on_cpu else ''}second, median ({SPREAD_LEGEND})",
                          WOK, spread=error_bars(rates)))
    rate.add_trace(
        series(
            df.prompt_tokens,
            df.attention_share * 100,
            "share of the work spent mixing (attention, computed)",
            GREY,
            mode="lines",
            dash="dash",
        ),
        secondary_y=True,
    )
    if result.saturation_tokens:
        mark_x(rate, result.saturation_tokens, "the wok is full", log_x=True)
    rate.update_xaxes(title="prompt tokens", type="log")
    rate.update_yaxes(title="prompt tokens per second", secondary_y=False, rangemode="tozero")
    rate.update_yaxes(
        title="mixing share (%)", secondary_y=True, rangemode="tozero", showgrid=False, tickmode="auto"
    )
    return [ttft, finish(rate, "How fast the wok tosses: prompt tokens per second, and the growing share of mixing")]


# -- the experiment -------------------------------------------------------------------------------


def settings_form(ui, info) -> BanquetSettings:
    ctx = min(info.max_context - 1, MAX_SWEEP)
    options = sorted({n for n in (16, 32, 64, 128, 256, 512, 1024, 2048) if n <= ctx} | {ctx})
    longest = ui.select_slider(
        "Longest prompt (tokens)", options=options, value=options[-1], key="banquet-longest"
    )
    repeats = ui.slider("Repeats per length (the median is drawn, with the range as a bar)", 3, 7, 3, key="banquet-repeats")
    lengths = tuple(n for n in options if n <= longest)
    return BanquetSettings(lengths=lengths, repeats=repeats)


def record_settings(info) -> BanquetSettings:
    """Every doubling up to the context: a few minutes on a small CPU."""
    ctx = info.max_context
    return BanquetSettings(
        lengths=tuple([n for n in (16, 32, 64, 128, 256, 512, 1024) if n < ctx] + [ctx - 1])
    )


EXPERIMENT = Experiment(
    key="banquet",
    title="The big banquet: how long until the first dish?",
    nav_title="Big banquet: TTFT vs prompt length",
    icon=":material/skillet:",
    kitchen="A birthday banquet puts a whole table's ingredients in one wok. Same wok, same heat: at first "
    "a fuller wok costs little extra, then every extra ingredient adds its own time, and mixing everything "
    "with everything else adds more. Time to the first dish (TTFT) is the wok's time.",
    engineering="Prefill runs all L prompt tokens through the model in one forward pass. Matmul work grows "
    "like L, attention's like L². We time prefill-only runs (one new token) for prompt lengths up to the "
    "model's context and mark where prefill tokens/s stops improving: the wok is saturated.",
    predict=Prediction(
        question="How many times longer will TTFT be at the longest prompt than at the shortest?",
        unit="x",
        min_value=1.0,
        max_value=10000.0,
        step=1.0,
        answer=lambda r: r.points[-1].ttft_s / r.points[0].ttft_s,
    ),
    form=settings_form,
    run=run_banquet,
    figures=banquet_figures,
    record=record_settings,
    story=StoryLink(
        ":material/cake: The banquet that took three times as long",
        "**Long prompts**: prefill time grows with prompt length (and attention's share grows faster).",
        "Lab: big banquet (TTFT vs prompt length)",
    ),
)
