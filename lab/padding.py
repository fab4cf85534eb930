"""Experiment 6, the prep standard: padding waste when a batch of unequal prompts shares one wok.

Kitchen words: the supervisor's rule was "no idle wok": no heat spent on an empty corner of the pan
waiting for a missing ingredient. Padding is exactly that: to toss guests' orders of 8 and 200
ingredients together, the short orders are topped up with filler so every row is 200 long, and
the wok heats the filler too.

Engine words: `batching="padded"` left-pads every prompt to the longest and masks the padding, so
the prefill computes B x max(L) token slots; `batching="packed"` concatenates the prompts into one
row of sum(L) tokens with a block-diagonal causal mask, so no slot is wasted. Wasted slots =
slots - real tokens; the idle-wok share = wasted / slots.

Measured per mode: `repeats` prefill-only generations (max_new_tokens=1) of the same mixed batch;
median prefill pass time; slots and tokens as the engine reports them in the trace.
Guarantee tested: packed never computes more slots than padded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd
import plotly.graph_objects as go

from engine.errors import EngineError
from lab import kitchens
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
from lab.plot_kit import MODE_COLOURS, POT, WOK, finish, guess_marker
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.sample import Sample, sample_of
from lab.workload import check_fits, mixed_prompts

MODES = ("padded", "packed")


@dataclass(frozen=True)
class PaddingSettings:
    lengths: tuple[int, ...] = (8, 16, 24, 40, 64, 96, 160, 256)
    repeats: int = 3


@dataclass(frozen=True)
class PaddingPoint:
    mode: str
    tokens: int  # real prompt tokens in the batch
    slots: int  # token positions the prefill computed
    wasted_slots: int
    idle_share: float  # wasted / slots
    prefill_s: float  # median prefill pass
    ttft_s: float  # median TTFT
    us_per_real_token: float  # prefill time / real tokens
    prefill: Spread  # seconds: median and range of the repeats


@dataclass(frozen=True)
class PaddingResult:
    settings: PaddingSettings
    points: list[PaddingPoint]
    same_tokens: bool  # both modes sampled the same first token for every sequence
    sample: Sample
    notes: list[str] = field(default_factory=list)
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def point(self, mode: str) -> PaddingPoint:
        return next(p for p in self.points if p.mode == mode)

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for p in self.points:
            row = {k: v for k, v in asdict(p).items() if k != "prefill"}
            row.update(prefill_low_s=p.prefill.low, prefill_high_s=p.prefill.high, repeats=p.prefill.n)
            rows.append(row)
        return pd.DataFrame(rows)


def measure_mode(engine, prompts: list[list[int]], mode: str, repeats: int):
    kitchens.generate(engine, prompts, max_new_tokens=1, stop_at_eos=False, batching=mode)  # warm-up: a GPU's first call of a new shape is slow (lazy init, kernel choice), so it is not timed
    runs = [
        kitchens.generate(engine, prompts, max_new_tokens=1, temperature=0.0, stop_at_eos=False, batching=mode)
        for _ in range(max(MIN_REPEATS, repeats))
    ]
    pre = runs[-1].trace.prefill
    spread = spread_of([r.trace.prefill.seconds for r in runs])
    prefill_s = spread.median
    point = PaddingPoint(
        mode=mode,
        tokens=pre.tokens,
        slots=pre.slots,
        wasted_slots=pre.slots - pre.tokens,
        idle_share=(pre.slots - pre.tokens) / pre.slots if pre.slots else 0.0,
        prefill_s=prefill_s,
        ttft_s=median_of([r.metrics.ttft_s for r in runs]),
        us_per_real_token=prefill_s / pre.tokens * 1e6 if pre.tokens else 0.0,
        prefill=spread,
    )
    return point, runs[-1]


def run_padding(engine, settings: PaddingSettings, on_progress: ProgressFn | None = None) -> PaddingResult:
    """Prefill the same mixed-length batch padded and packed; compare slots, waste and time."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    lengths = list(settings.lengths)
    if len(lengths) < 2:
        raise EngineError(f"prep standard: need at least 2 prompts of different lengths, got {len(lengths)}")
    for n in lengths:
        check_fits(engine, n, 1, "prep standard")
    prompts = mixed_prompts(engine, lengths)
    tracker = ProgressTracker([len(lengths) * max(lengths), sum(lengths)], on_progress)
    engine.generate(prompts[:1], max_new_tokens=1, stop_at_eos=False)  # warm-up
    points, results = [], {}
    for mode in MODES:
        point, results[mode] = measure_mode(engine, prompts, mode, max(1, settings.repeats))
        points.append(point)
        tracker.step(f"{mode}: {point.slots} slots in {point.prefill_s * 1e3:.1f} ms")
    same = results["padded"].tokens == results["packed"].tokens
    pad, pack = points
    notes = [
        f"padded: {pad.slots} slots for {pad.tokens} real tokens, {pad.idle_share:.0%} of the wok idle",
        f"packed: {pack.slots} slots, {pack.idle_share:.0%} idle; prefill {pad.prefill_s * 1e3:.1f} -> "
        f"{pack.prefill_s * 1e3:.1f} ms ({pad.prefill_s / pack.prefill_s:.2f}x)"
        if pack.prefill_s > 0
        else "",
        "both modes sampled the same first tokens"
        if same
        else "WARNING: padded and packed disagree on tokens",
    ]
    machine = watch.finish()
    if clearly_apart(pad.prefill, pack.prefill):
        faster = "packed" if pack.prefill_s < pad.prefill_s else "padded"
        notes.append(f"{faster} was faster by more than the repeats vary")
    else:
        notes.append(machine.too_noisy("which one was faster"))
    return PaddingResult(
        settings=settings,
        points=points,
        same_tokens=same,
        sample=sample_of(results["padded"], "padded batch"),
        notes=[n for n in notes if n],
        machine=machine,
    )


# -- figures --------------------------------------------------------------------------------------


def padding_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    slots = go.Figure()
    slots.add_trace(go.Bar(x=df["mode"], y=df.tokens, name="real tokens", marker_color=POT))
    slots.add_trace(
        go.Bar(
            x=df["mode"],
            y=df.wasted_slots,
            name="padding (idle wok)",
            marker_color=WOK,
            text=[f"{s:.0%} idle" for s in df.idle_share],
            textposition="outside",
        )
    )
    if guess is not None:
        pad = df[df["mode"] == "padded"].iloc[0]
        slots.add_trace(guess_marker("padded", pad.slots * guess / 100, f"your guess: {guess:g}% idle"))
    slots.update_layout(barmode="stack")
    slots.update_yaxes(title="token slots computed in prefill")
    time = go.Figure(
        go.Bar(
            x=df["mode"],
            y=df.prefill_s * 1e3,
            marker_color=[MODE_COLOURS[m] for m in df["mode"]],
            text=[f"{v * 1e3:.1f} ms" for v in df.prefill_s],
            textposition="outside",
            error_y=error_bars([p.prefill for p in result.points], 1e3),
            name=f"median ({SPREAD_LEGEND})",
        )
    )
    time.update_yaxes(title="prefill pass (ms, median)")
    return [
        finish(slots, "The prep standard: slots the wok heats, padded vs packed"),
        finish(time, f"Prefill time for the same mixed batch ({SPREAD_LEGEND})"),
    ]


# -- the experiment -------------------------------------------------------------------------------


def parse_lengths(text: str, limit: int) -> tuple[int, ...]:
    values = [int(v) for v in text.replace(" ", "").split(",") if v.isdigit()]
    return tuple(min(max(v, 1), limit) for v in values)


def settings_form(ui, info) -> PaddingSettings:
    text = ui.text_input(
        "Prompt lengths in the batch (comma-separated tokens)",
        "8, 16, 24, 40, 64, 96, 160, 256",
        key="padding-lengths",
    )
    lengths = parse_lengths(text, info.max_context - 1)
    if len(lengths) < 2:
        ui.warning("Give at least two prompt lengths; using the default batch.")
        lengths = PaddingSettings().lengths
    repeats = ui.slider("Repeats (the median is drawn, with the range as a bar)", 3, 7, 3, key="padding-repeats")
    return PaddingSettings(lengths=lengths, repeats=repeats)


EXPERIMENT = Experiment(
    key="padding",
    title="The prep standard: no idle wok",
    nav_title="Prep standard: padding waste",
    icon=":material/content_cut:",
    kitchen="To toss orders of 8 and 200 ingredients together, padding tops the small orders up with filler "
    "so every row is as long as the longest, and the wok heats the filler too. The supervisor's rule: no "
    "heat on an empty corner of the pan.",
    engineering="`padded` left-pads every prompt to the longest and masks the pads: B × max(L) slots. "
    "`packed` concatenates the prompts into one row with a block-diagonal causal mask: sum(L) slots, none "
    "wasted. Same first tokens either way.",
    predict=Prediction(
        question="What % of the padded wok's token slots are padding?",
        unit="%",
        min_value=0.0,
        max_value=100.0,
        step=5.0,
        answer=lambda r: r.point("padded").idle_share * 100,
    ),
    form=settings_form,
    run=run_padding,
    figures=padding_figures,
    record=lambda info: PaddingSettings(),
    story=StoryLink(
        ":material/content_cut: Prepping every ingredient first",
        "**Padding waste** in prefill: mixed prompt lengths padded to the longest burn compute on nothing; "
        "packing them avoids it.",
        "Lab: prep standard (padding)",
    ),
)
