"""Experiment 5, the portioning station: how much of a soup-pot step is the soup at all?

Kitchen words: each ladle is quick, but between ladles the cook wipes the rim, fetches a bowl,
checks the order slip. With a tiny pot those chores can take longer than the ladling. The
supervisor's portioning station pre-portions the broth so each order needs only the last touch:
fewer chores between ladles.

Engine words: a decode step is one forward pass for one token per sequence plus sampling and
bookkeeping. For a small model on a CPU (or any model on a fast GPU), the math is so short that
Python, tensor allocation, op dispatch, sampling and (on GPU) kernel launches take a large share.
CUDA graphs record the step's kernels once and replay them with one launch.

What is measured, and how (on CPU there is no separate "kernel time", so we say what we count):
  step       wall time of each decode step, from the engine's trace (no profiler attached)
  forward    the forward pass alone (`StepRecord.forward_s`), same runs
  math share the summed *self* time of every aten op (torch.profiler; on GPU, the summed
             duration of every device kernel, CUDA-graph replays included) during decode, over
             the decode wall time of the same profiled run: the share
             of a step spent inside the math kernels, Python and module glue excluded. Decode-only
             op time = op time of an N-token run minus that of a 1-token run of the same prompt.
             Median over `repeats` (at least three); each repeat's step and share are kept, so
             the chart draws the step's range and the page states "the overhead is the larger part"
             only where the share's range lies wholly on one side of a half.
  Breakdown per step: math = share x step; glue = forward - math (Python, modules, allocation,
  dispatch); outside = step - forward (sampling, cache bookkeeping, events).
Caveat: the profiler's op time includes sampling's few ops (argmax), which run outside forward;
glue is clamped at zero. Profiling slows the run; only the op self-times are taken from it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import pandas as pd
import plotly.graph_objects as go
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from engine.errors import EngineError
from engine.native import NATIVE_LABEL
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
from lab.plot_kit import GREY, POT, finish, guess_marker
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.sample import Sample, sample_of
from lab.workload import batch_prompts, check_fits


@dataclass(frozen=True)
class OverheadSettings:
    prompt_len: int = 32
    new_tokens: int = 32
    batch: int = 1
    repeats: int = 3


@dataclass(frozen=True)
class OverheadPoint:
    variant: str  # "op by op" (the model's forward), "native step", "eager" or "CUDA graphs"
    step_ms: float  # median decode step, wall
    forward_ms: float  # median forward pass
    math_ms: float  # op self time per decode step (profiler)
    glue_ms: float  # forward - math
    outside_ms: float  # step - forward
    math_share: float  # math / step
    decode_tps: float
    step: Spread  # seconds: each repeat's median decode step, wall
    share: Spread  # each repeat's math share of the decode phase (profiled)
    # Ops dispatched per decode step (aten ops and native calls; on GPU, kernels): the count behind the
    # chores, the same on any machine at any load (a neighbour stretches their time, never their number).
    ops_per_step: float = 0.0


@dataclass(frozen=True)
class OverheadResult:
    settings: OverheadSettings
    device: str
    points: list[OverheadPoint]
    sample: Sample
    notes: list[str] = field(default_factory=list)
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for p in self.points:
            row = {k: v for k, v in asdict(p).items() if k not in ("step", "share")}
            row.update(step_low_ms=p.step.low * 1e3, step_high_ms=p.step.high * 1e3, repeats=p.step.n,
                       math_share_low=p.share.low, math_share_high=p.share.high)  # fmt: skip
            rows.append(row)
        return pd.DataFrame(rows)


@dataclass(frozen=True)
class OpTotals:
    """What a profile saw of the math: its summed self time, and how many ops (or kernels) ran."""

    seconds: float
    calls: int


def op_totals(prof, on_gpu: bool) -> OpTotals:
    """Time spent in the math itself, and the number of op calls that spent it, from a profile.

    CPU: the summed self time of aten ops (time inside op code, children excluded, so nothing is
    counted twice), and of the native decode step's one C call (engine/native.py labels it
    `NATIVE_LABEL` while a profiler runs): the whole layer math is inside that call.
    GPU: the summed duration of the device's kernels, however they were launched;
    with CUDA graphs the replayed kernels belong to no aten op, so op-attributed device time would
    read ~0.
    """
    total_us, calls = 0.0, 0
    for ev in prof.key_averages():
        if on_gpu:
            if ev.device_type == DeviceType.CUDA:
                total_us, calls = total_us + ev.self_device_time_total, calls + ev.count
        elif ev.key.startswith("aten::") or ev.key == NATIVE_LABEL:
            total_us, calls = total_us + ev.self_cpu_time_total, calls + ev.count
    return OpTotals(total_us / 1e6, calls)


# Kineto (torch.profiler's tracer) prints a "USDT: ... profiler_start" / "profiler_stop" line at every
# profile, at its top log level: in the app's server that is the class's terminal, once per sweep.
# Its levels run VERBOSE 0 .. USDT 5; 6 keeps it silent. Read when a profile starts; a developer's
# own KINETO_LOG_LEVEL wins.
KINETO_QUIET = "6"


def profiled_run(engine, prompts, new_tokens: int, order: dict, on_gpu: bool) -> tuple[OpTotals, float]:
    """(the math's op totals, summed wall time of the decode steps) of one profiled generation."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        res = engine.generate(
            prompts, max_new_tokens=new_tokens, temperature=0.0, stop_at_eos=False, **order
        )
    return op_totals(prof, on_gpu), sum(st.seconds for st in res.trace.decode_steps)


@dataclass(frozen=True)
class DecodeMath:
    share: float  # of the decode phase's wall time, inside the math
    ops_per_step: float  # op calls (GPU: kernels) per decode step


def decode_math(engine, prompts, s: OverheadSettings, order: dict, on_gpu: bool) -> DecodeMath:
    """Share of the decode phase spent inside aten ops, both measured in the same profiled run.

    Decode op time = op time of an N-token run - op time of a 1-token run (same prompt, same
    prefill). Dividing by the profiled run's own decode wall time keeps the profiler's slowdown on
    both sides of the ratio. The op calls are differenced the same way, over the N - 1 decode steps.
    """
    full, decode_wall = profiled_run(engine, prompts, s.new_tokens, order, on_gpu)
    first, _ = profiled_run(engine, prompts, 1, order, on_gpu)
    share = min(1.0, max(0.0, full.seconds - first.seconds) / decode_wall) if decode_wall > 0 else 0.0
    return DecodeMath(share, (full.calls - first.calls) / (s.new_tokens - 1))


def measure_variant(engine, prompts, s: OverheadSettings, variant: str, order: dict, on_gpu: bool):
    """Repeats of: a plain run (step and forward times), then a profiled pair (the math share).

    The median math share is applied to the median plain step: the profiler never touches the
    times we report, and a load burst during one repeat moves one share, not the answer.
    """
    # Warm this variant up first: a CUDA graph is captured on its first use, which is not a step.
    engine.generate(prompts, max_new_tokens=4, stop_at_eos=False, **order)
    steps_s, cpus_s, forwards_s, shares, last, math = [], [], [], [], None, None
    for _ in range(max(MIN_REPEATS, s.repeats)):
        timed = generate_timed(
            engine,
            prompts,
            max_new_tokens=s.new_tokens,
            temperature=0.0,
            stop_at_eos=False,
            **order,
        )
        last = timed.result
        cpus_s.append(median_of(timed.decode_cpu_s))
        step = median_of([st.seconds for st in last.trace.decode_steps])
        steps_s.append(step)
        forwards_s.append(median_of([st.forward_s for st in last.trace.decode_steps]))
        math = decode_math(engine, prompts, s, order, on_gpu)
        shares.append(math.share)
    step_s = median_of(steps_s)
    forward_s = min(median_of(forwards_s), step_s)
    math_s = min(median_of(shares) * step_s, forward_s)
    point = OverheadPoint(
        variant=variant,
        step_ms=step_s * 1e3,
        forward_ms=forward_s * 1e3,
        math_ms=math_s * 1e3,
        glue_ms=(forward_s - math_s) * 1e3,
        outside_ms=(step_s - forward_s) * 1e3,
        math_share=math_s / step_s if step_s > 0 else 0.0,
        decode_tps=s.batch / step_s if step_s > 0 else 0.0,
        step=spread_of(steps_s),
        share=spread_of(shares),
        ops_per_step=math.ops_per_step,
    )
    return point, sample_of(last, f"{variant}, batch {s.batch}")


def run_overhead(engine, settings: OverheadSettings, on_progress: ProgressFn | None = None) -> OverheadResult:
    """Decode step time split into math, glue inside forward, and chores outside forward."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    if settings.new_tokens < 4:
        raise EngineError(f"portioning station: new_tokens must be at least 4, got {settings.new_tokens}")
    check_fits(engine, settings.prompt_len, settings.new_tokens, "portioning station")
    device = str(engine.info.device)
    on_gpu = device.startswith("cuda") and torch.cuda.is_available()
    variants = lesson_variants(engine, on_gpu)
    prompts = batch_prompts(engine, settings.batch, settings.prompt_len)
    tracker = ProgressTracker([1.0] * len(variants), on_progress)
    engine.generate(prompts, max_new_tokens=2, stop_at_eos=False)  # warm-up
    points, sample = [], None
    for name, order in variants:
        point, sample = measure_variant(engine, prompts, settings, name, order, on_gpu)
        points.append(point)
        tracker.step(f"{name}: step {point.step_ms:.2f} ms, math {point.math_share:.0%}")
    eager = points[0]
    notes = [
        f"{eager.variant} decode step {eager.step_ms:.2f} ms: math {eager.math_ms:.2f} ms ({eager.math_share:.0%}), "
        f"glue inside forward {eager.glue_ms:.2f} ms, outside forward {eager.outside_ms:.2f} ms",
    ]
    for g in points[1:]:
        notes.append(f"{g.variant}: step {eager.step_ms:.2f} -> {g.step_ms:.2f} ms ({eager.step_ms / g.step_ms:.1f}x); "
                     f"ops dispatched per step {eager.ops_per_step:.0f} -> {g.ops_per_step:.0f}")
    if len(points) == 1:
        notes.append(f"no portioning station here ({device}: CUDA graphs need a GPU, and the native step could "
                     f"not be built: {engine.native.problem if engine.native else 'not this model'})")  # fmt: skip
    machine = watch.finish()
    notes += overhead_findings(points, machine)
    return OverheadResult(settings=settings, device=device, points=points, sample=sample, notes=notes,
                          machine=machine)  # fmt: skip


def lesson_variants(engine, on_gpu: bool) -> list[tuple[str, dict]]:
    """The step as the chores-per-ladle baseline, then with the portioning station: on a GPU the
    same step replayed as CUDA graphs; on a CPU the native step, all layers in one C call
    (engine/native.py), against the model's forward run one torch op at a time."""
    if on_gpu:
        return [("eager", {}), ("CUDA graphs", {"cuda_graph": True})]
    if engine.native is not None and engine.native.ready:
        return [("op by op", {"native": False}), ("native step", {"native": True})]
    return [("op by op", {})]


def overhead_findings(points: list[OverheadPoint], machine: Machine) -> list[str]:
    """What the repeats allow to be said: which part is larger, and whether CUDA graphs helped."""
    eager, out = points[0], []
    if eager.share.low > 0.5:
        out.append(f"the math is most of the {eager.variant} step ({eager.share.low:.0%} to {eager.share.high:.0%} "
                   "over the repeats)")  # fmt: skip
    elif eager.share.high < 0.5:
        out.append(f"the overhead is most of the {eager.variant} step: the math is {eager.share.low:.0%} to "
                   f"{eager.share.high:.0%} of it over the repeats")  # fmt: skip
    else:
        out.append(machine.too_noisy("whether math or overhead is the larger part of the step"))
    for g in points[1:]:
        if clearly_apart(eager.step, g.step):
            word = "faster" if g.step.median < eager.step.median else "slower"
            out.append(f"{g.variant}: the step is {word} than {eager.variant} by more than the repeats vary")
        else:
            out.append(machine.too_noisy(f"whether {g.variant} change the step"))
    return out


# -- figures --------------------------------------------------------------------------------------


def overhead_figure(result, guess: float | None = None) -> go.Figure:
    df = result.to_frame()
    fig = go.Figure()
    parts = (
        ("math_ms", "model math (op self time; the native step: its one C call)", POT),
        ("glue_ms", "glue inside forward", "#f0a202"),
        ("outside_ms", "outside forward (sampling, bookkeeping)", GREY),
    )
    for col, name, colour in parts:
        fig.add_trace(
            go.Bar(
                x=df.variant,
                y=df[col],
                name=name,
                marker_color=colour,
                text=[f"{v:.2f} ms" for v in df[col]],
                textposition="inside",
            )
        )
    fig.add_trace(
        go.Scatter(x=df.variant, y=df.step_ms, mode="markers", name=f"whole step ({SPREAD_LEGEND})",
                   marker=dict(color="black", symbol="line-ew-open", size=18),
                   error_y=error_bars([p.step for p in result.points], 1e3))
    )  # fmt: skip
    if guess is not None:
        fig.add_trace(
            guess_marker(df.variant.iloc[0], df.step_ms.iloc[0] * guess / 100, f"your guess: math {guess:g}%")
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="per decode step (ms)")
    return finish(fig, f"The portioning station: what one decode step is made of ({result.device})")


# -- the experiment -------------------------------------------------------------------------------


def settings_form(ui, info) -> OverheadSettings:
    batch = ui.select_slider("Batch", options=[1, 2, 4, 8, 16], value=1, key="overhead-batch")
    new_tokens = ui.slider("Decode steps", 8, 64, 32, key="overhead-new")
    return OverheadSettings(batch=batch, new_tokens=new_tokens)


EXPERIMENT = Experiment(
    key="overhead",
    title="The portioning station: per-step overhead",
    nav_title="Portioning station: per-step overhead",
    icon=":material/timer:",
    kitchen="Each ladle is quick, but between ladles the cook wipes the rim, fetches a bowl, reads the slip. "
    "With a small pot those chores can take longer than the ladling itself. The supervisor's portioning "
    "station does the chores once, ahead of time.",
    engineering="A decode step = one forward pass + sampling + bookkeeping. We split its wall time into the "
    "math (summed self time of the aten ops, from torch.profiler), glue inside the forward pass (Python, "
    "modules, allocation, dispatch) and work outside it, first with the model's forward run one torch op at a "
    "time. Then the portioning station: on a CPU the engine's native step, every layer in one C call (its "
    "time is the math); on a GPU the step replayed as a CUDA graph.",
    predict=Prediction(
        question="What % of a decode step is the model's math?",
        unit="%",
        min_value=0.0,
        max_value=100.0,
        step=5.0,
        answer=lambda r: r.points[0].math_share * 100,
    ),
    form=settings_form,
    run=run_overhead,
    figures=lambda r, g: [overhead_figure(r, g)],
    record=lambda info: OverheadSettings(prompt_len=32, new_tokens=32, repeats=3),
    story=StoryLink(
        ":material/soup_kitchen: The portioning station",
        "**Per-step overhead**: Python, allocation, sampling and kernel launches between the real work of "
        "each decode step; CUDA graphs and leaner loops remove it.",
        "Lab: the portioning station",
    ),
)
