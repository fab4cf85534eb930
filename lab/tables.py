"""Experiment 2, more tables: what batching does to the soup pot and to the wok.

Kitchen words: the soup pot's slow part is lifting the ladle (reading every weight) for each
spoonful. Serving ten tables from one lift costs barely more than serving one, so the time per
ladle stays flat while bowls per minute climb, until the pot is doing real work for every bowl and
each extra table adds its own time. The wok is different: it was already busy with a whole table's
ingredients, so more tables just means proportionally more tossing; its time per ingredient is
flat from the start.

Engine words: a decode step for batch B reads all weights once (bytes ~ weights) and does 2 x
params x B FLOPs: at small B it is memory-bound, so step time barely moves with B and decode
tokens/s grows ~linearly. As B grows, intensity crosses the machine's ridge and the step turns
compute-bound: step time rises ~linearly with B. Prefill of B x P tokens is compute-bound already,
so its time per token is ~constant in B. This is the shape of Sarathi-Serve's figure 2 (per-token
cost of prefill vs decode over batch size), measured here on this machine.

Measured per batch size: one generation of `new_tokens` tokens from B prompts of `prompt_len`,
repeated `repeats` (at least 3) times; decode step time = median over all decode steps of all
repeats (wall, and CPU time via `lab.cpu_time`), with the range of the repeats' own medians
(`lab.noise.Spread`) drawn as error bars; prefill time per token = median prefill pass / (B x
prompt_len). The knee (where a step costs 1.5x batch 1's) is stated only past that range.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.errors import EngineError
from lab.cpu_time import generate_timed
from lab.experiment import Experiment, Prediction, StoryLink, decode_verdict
from lab.noise import MIN_REPEATS, SPREAD_LEGEND, Machine, MachineWatch, Spread, error_bars, spread_of
from lab.plot_kit import GREY, POT, WOK, cpu_time_line, finish, guess_marker, series
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.sample import Sample, sample_of
from lab.workload import batch_prompts, check_fits


@dataclass(frozen=True)
class TablesSettings:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prompt_len: int = 32
    new_tokens: int = 16
    repeats: int = 3


@dataclass(frozen=True)
class TablesPoint:
    batch: int
    decode_step_s: float  # median decode step (all sequences advance one token)
    decode_tps: float  # batch / decode step: tokens per second over the whole batch
    decode_cpu_step_s: float  # median process CPU time of a decode step (see lab/cpu_time.py)
    decode_us_per_token: float  # decode step / batch
    prefill_s: float  # median prefill pass for batch x prompt_len tokens
    prefill_us_per_token: float
    decode_intensity: float  # analytic FLOP/byte of a decode step at this batch
    step: Spread  # seconds: the repeats' median decode steps, wall clock
    cpu_step: Spread  # seconds: the same in process CPU time


@dataclass(frozen=True)
class TablesResult:
    settings: TablesSettings
    points: list[TablesPoint]
    sample: Sample
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"  # CPU time is the work's own cost only when the work runs on the CPU
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for p in self.points:
            row = {k: v for k, v in asdict(p).items() if k not in ("step", "cpu_step")}
            row.update(decode_step_low_s=p.step.low, decode_step_high_s=p.step.high, repeats=p.step.n)
            rows.append(row)
        return pd.DataFrame(rows)


def measure_batch(engine, batch: int, s: TablesSettings) -> tuple[TablesPoint, Sample]:
    prompts = batch_prompts(engine, batch, s.prompt_len)
    engine.generate(prompts, max_new_tokens=2, stop_at_eos=False)  # warm-up: a GPU's first call of a new shape is slow (lazy init, kernel choice), so it is not timed
    timed = [
        generate_timed(engine, prompts, max_new_tokens=s.new_tokens, temperature=0.0, stop_at_eos=False)
        for _ in range(max(MIN_REPEATS, s.repeats))
    ]
    runs = [t.result for t in timed]
    steps = [st for r in runs for st in r.trace.decode_steps]
    if not steps:
        raise EngineError(
            f"more tables: new_tokens must be at least 2 to time decode steps, got {s.new_tokens}"
        )
    step_s = median_of([st.seconds for st in steps])
    prefill_s = median_of([r.trace.prefill.seconds for r in runs])
    point = TablesPoint(
        batch=batch,
        decode_step_s=step_s,
        decode_tps=batch / step_s if step_s > 0 else 0.0,
        decode_cpu_step_s=median_of([c for t in timed for c in t.decode_cpu_s]),
        decode_us_per_token=step_s / batch * 1e6,
        prefill_s=prefill_s,
        prefill_us_per_token=prefill_s / (batch * s.prompt_len) * 1e6,
        decode_intensity=median_of([st.intensity for st in steps]),
        step=spread_of([median_of([st.seconds for st in r.trace.decode_steps]) for r in runs]),
        cpu_step=spread_of([median_of(t.decode_cpu_s) for t in timed]),
    )
    return point, sample_of(runs[-1], f"batch {batch}")


def knee(points: list[TablesPoint], on_cpu: bool, rise: float = 1.5) -> tuple[int | None, bool]:
    """(the first batch whose decode step costs `rise` x (50 % more than) batch 1's, whether the
    repeats' spread allows saying so): the pot turns busy there.

    On a CPU the step's CPU time decides (a neighbour's burst moves it less); elsewhere, wall time.
    A knee stands when even that batch's fastest repeat costs `rise` x batch 1's slowest; "no knee
    in this range" stands when every batch's slowest repeat stays under `rise` x batch 1's fastest.
    Example: batch 1 at 2.0-2.2 ms, batch 32 at 3.4-3.6 ms -> (32, True); at 2.9-3.6 ms -> (32, False).
    """
    if not points:
        return None, False
    cost = [p.cpu_step if on_cpu else p.step for p in points]
    first = cost[0]
    k = next((i for i, c in enumerate(cost) if c.median >= rise * first.median), None)
    if k is None:
        return None, all(c.high < rise * first.low for c in cost)
    return points[k].batch, cost[k].low >= rise * first.high


def run_tables(engine, settings: TablesSettings, on_progress: ProgressFn | None = None) -> TablesResult:
    """Decode step time, decode tokens/s and prefill time per token for each batch size."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    batches = sorted(set(settings.batches))
    if settings.new_tokens < 2:
        raise EngineError(
            f"more tables: new_tokens must be at least 2 to time decode steps, got {settings.new_tokens}"
        )
    check_fits(engine, settings.prompt_len, settings.new_tokens, "more tables")
    tracker = ProgressTracker([b * (settings.prompt_len + settings.new_tokens) for b in batches], on_progress)
    engine.generate(
        batch_prompts(engine, 1, settings.prompt_len), max_new_tokens=2, stop_at_eos=False
    )  # warm-up
    points, sample = [], None
    for b in batches:
        point, sample = measure_batch(engine, b, settings)
        points.append(point)
        tracker.step(f"batch {b}: decode step {point.decode_step_s * 1e3:.1f} ms")
    on_cpu = str(engine.info.device).startswith("cpu")
    k, sure = knee(points, on_cpu)
    machine = watch.finish()
    first, last = points[0], points[-1]
    clock = "CPU time" if on_cpu else "time"
    notes = [
        f"batch {first.batch} -> {last.batch}: decode step {first.decode_step_s * 1e3:.1f} -> "
        f"{last.decode_step_s * 1e3:.1f} ms ({last.decode_step_s / first.decode_step_s:.1f}x) "
        "while the batch "
        f"grew {last.batch // first.batch}x; decode tokens/s {first.decode_tps:.0f} -> {last.decode_tps:.0f}",
        f"prefill time per token {first.prefill_us_per_token:.0f} -> {last.prefill_us_per_token:.0f} us",
        (
            machine.too_noisy("where the pot gets busy")
            if not sure
            else f"one ladle (decode step, {clock}) first costs 1.5x one table's at batch {k}, by more than "
            "the repeats vary: from there each extra table adds real work"
            if k
            else f"one ladle (decode step, {clock}) stayed under 1.5x one table's over the whole range, by more "
            "than the repeats vary: the pot's time goes to lifting the ladle (reading the weights), not to the bowls"
        ),
    ]
    if on_cpu:
        notes.insert(
            1,
            f"decode step CPU time {first.decode_cpu_step_s * 1e3:.2f} -> "
            f"{last.decode_cpu_step_s * 1e3:.2f} ms "
            f"({last.decode_cpu_step_s / first.decode_cpu_step_s:.1f}x)",
        )
    return TablesResult(
        settings=settings, points=points, sample=sample, notes=notes, device=str(engine.info.device),
        machine=machine,
    )


# -- figures --------------------------------------------------------------------------------------


def tables_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    per_token = go.Figure()
    per_token.add_trace(series(df.batch, df.decode_us_per_token, "decode, per token", POT))
    per_token.add_trace(series(df.batch, df.prefill_us_per_token, "prefill, per token", WOK))
    per_token.update_xaxes(title="batch size (sequences)", type="log")
    per_token.update_yaxes(title="time per token (µs)", type="log")
    finish(
        per_token, "Per-token cost vs batch: decode gets cheaper per token, prefill is flat from the start"
    )

    step = make_subplots(specs=[[{"secondary_y": True}]])
    step.add_trace(series(df.batch, df.decode_step_s * 1e3, f"one ladle (decode step), median ({SPREAD_LEGEND})",
                          POT, spread=error_bars([p.step for p in result.points], 1e3)))
    step.add_trace(
        series(df.batch, df.decode_tps, "bowls per second (tokens/s, right axis)", GREY, dash="dash"),
        secondary_y=True,
    )
    if result.device == "cpu":
        step.add_trace(cpu_time_line(df.batch, df.decode_cpu_step_s * 1e3, "the pot's own work (CPU time), median", POT))
    if guess is not None:
        step.add_trace(
            guess_marker(df.batch.iloc[-1], df.decode_step_s.iloc[0] * 1e3 * guess, f"your guess: {guess:g}x",
                         "top left")
        )
    step.update_xaxes(title="batch size (sequences)", type="log")
    step.update_yaxes(title="one ladle (ms)", rangemode="tozero", secondary_y=False)
    step.update_yaxes(
        title="tokens / s", rangemode="tozero", secondary_y=True, showgrid=False, tickmode="auto"
    )
    return [finish(step, "More tables: one ladle serves the whole batch, until the pot gets busy"), per_token]


# -- the experiment -------------------------------------------------------------------------------


def settings_form(ui, info) -> TablesSettings:
    largest = ui.select_slider(
        "Largest batch", options=[4, 8, 16, 32, 64, 128], value=64, key="tables-largest"
    )
    prompt_len = ui.slider(
        "Prompt length (tokens)", 8, min(256, info.max_context // 2), 32, key="tables-prompt"
    )
    new_tokens = ui.slider("New tokens per sequence", 4, 64, 16, key="tables-new")
    batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= largest)
    return TablesSettings(batches=batches, prompt_len=prompt_len, new_tokens=new_tokens)


EXPERIMENT = Experiment(
    key="tables",
    title="More tables: one ladle, many bowls",
    nav_title="More tables: batch size",
    icon=":material/table_restaurant:",
    kitchen="The soup pot's slow part is lifting the ladle: reading the whole pot for every spoonful. "
    "Serving "
    "more tables from the same lift costs little extra, until each bowl needs real work of its own. The wok "
    "is already busy with a full pan, so more tables simply take proportionally longer.",
    engineering="A decode step reads every weight once, whatever the batch, and does 2 FLOPs per weight per "
    "sequence. At small batch it is memory-bound: the step time stays flat while tokens/s grows. Past the "
    "machine's ridge it turns compute-bound and rises. Prefill's time per token is flat from the start "
    "(the shape of figure 2 of the Sarathi-Serve paper, measured live).",
    predict=Prediction(
        question="At the largest batch, how many times longer does one decode step take than at batch 1?",
        unit="x",
        min_value=0.1,
        max_value=1000.0,
        step=0.5,
        answer=lambda r: r.points[-1].decode_step_s / r.points[0].decode_step_s,
    ),
    form=settings_form,
    run=run_tables,
    figures=tables_figures,
    record=lambda info: TablesSettings(batches=(1, 2, 4, 8, 16, 32, 64), prompt_len=32, new_tokens=16),
    story=StoryLink(
        ":material/receipt_long: Order tickets on the rail",
        "The **batch**: requests served together. More tables barely slow a decode step (the weights are read "
        "once for all of them) until the step turns compute-bound.",
        "Lab: more tables (batch size)",
    ),
    verdict=decode_verdict,
)
