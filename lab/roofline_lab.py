"""Experiment 3, the roofline: each pot's steps placed under this machine's two ceilings.

Kitchen words: the kitchen has two limits: how fast ingredients arrive from the pantry (memory
bandwidth) and how fast the cooks can chop (compute). The wok chops a lot per armful fetched; it
is limited by the cooks. The soup pot fetches the whole pantry for one spoonful; it is limited by
the pantry door.

Engine words: a pass with F FLOPs and B bytes has intensity I = F / B. The machine can reach at
most min(peak FLOP/s, bandwidth x I). Both roofs are measured in this same run
(`engine.bench.roofline.measure_roofline`), not read off a spec sheet. Each measured step is placed at
its analytic I (from `engine.costs`, carried in the trace) and its achieved FLOP/s = F / forward
time, under the roof that explains it (`lab.roof_placement`: the DRAM roof, or the roof of the cache
its bytes fit in). The theory point sits straight above it on that roof; the gap is the % of roof
achieved.

Measured: the roofs before and after the passes (the best of each is kept: a ceiling is what the
machine can do), prefill passes for each prompt length (batch 1, prefill only) and decode steps for
each batch size (median over the steps of one generation). Times are the forward pass alone, so
sampling and bookkeeping are not counted against the roof (the portioning-station page measures
those). A small model's weights can sit in the CPU cache, so its decode step can beat the DRAM
roof: it is drawn under the cache's roof and one line says why. No point is drawn above every roof
without a line naming the artefact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from engine.bench.roofline import Roofline, best_roof, measure_roofline
from engine.costs import step_cost
from lab.experiment import Experiment, Prediction, StoryLink, decode_verdict
from lab.model_for import ASSISTANT
from lab.noise import Machine, MachineWatch
from lab.plot_kit import GREY, POT, WOK, finish, guess_marker, mark_x
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.roof_placement import cache_mb, place_point, roof_notes
from lab.sample import Sample, sample_of
from lab.workload import batch_prompts, check_fits


@dataclass(frozen=True)
class RooflineSettings:
    prompt_lens: tuple[int, ...] = (16, 64, 256)
    batches: tuple[int, ...] = (1, 4, 16)
    decode_prompt: int = 32
    new_tokens: int = 8
    quick: bool = True  # quick roofline measurement (fewer repeats, one GEMM size)


@dataclass(frozen=True)
class RoofPoint:
    phase: str  # "prefill" or "decode"
    label: str  # "prompt 256" / "batch 16"
    intensity: float  # FLOP / byte (analytic)
    flops: float
    bytes_moved: float
    forward_s: float  # measured
    achieved_flops_per_s: float
    attainable_flops_per_s: float  # the height at this intensity of the roof that explains the pass
    pct_of_roof: float  # achieved / attainable, in %
    theory_s: float  # the least time that roof allows: max(F / peak, B / its bandwidth)
    roof: str = "DRAM"  # the roof that explains it: "DRAM", or the cache its bytes fit in ("L3")
    above_every_roof: bool = False  # a measurement artefact, named in `line`
    line: str = ""  # why it is not simply under the roof its bytes come from; "" when it is


@dataclass(frozen=True)
class TheoryPoint:
    """Where the cost model puts a pass of this phase at one setting, and the roof's speed there."""

    phase: str
    setting: int  # prompt length (prefill) or batch size (decode)
    intensity: float
    attainable_flops_per_s: float
    ridge: float = 0.0  # FLOP/byte where the roof it sits under meets the compute roof


@dataclass(frozen=True)
class RooflineResult:
    settings: RooflineSettings
    roof: Roofline
    points: list[RoofPoint]
    sample: Sample
    notes: list[str] = field(default_factory=list)
    theory: list[TheoryPoint] = field(default_factory=list)  # each phase's path as its setting grows
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)
    model: str = ""  # the model measured, by name

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(p) for p in self.points])


def place(
    phase: str, label: str, flops: float, bytes_moved: float, forward_s: float, roof: Roofline
) -> RoofPoint:
    intensity = flops / bytes_moved if bytes_moved else 0.0
    achieved = flops / forward_s if forward_s > 0 else 0.0
    where = place_point(roof, f"{phase} {label}", intensity, bytes_moved, achieved)
    memory = next(m for m in roof.memory_roofs() if m.name == where.roof)
    return RoofPoint(
        phase=phase,
        label=label,
        intensity=intensity,
        flops=flops,
        bytes_moved=bytes_moved,
        forward_s=forward_s,
        achieved_flops_per_s=achieved,
        attainable_flops_per_s=where.attainable_flops_per_s,
        pct_of_roof=where.pct_of_roof,
        theory_s=max(flops / roof.flops_per_s, bytes_moved / memory.bandwidth_bytes_per_s),
        roof=where.roof,
        above_every_roof=where.above_every_roof,
        line=where.line,
    )


@dataclass(frozen=True)
class Pass:
    """One measured pass before it is placed under the roof (the roof is final only at the end)."""

    phase: str
    label: str
    flops: float
    bytes_moved: float
    forward_s: float


def prefill_pass(engine, length: int):
    engine.generate(batch_prompts(engine, 1, length), max_new_tokens=1, stop_at_eos=False)  # warm-up: a GPU's first call of a new shape is slow (lazy init, kernel choice), so it is not timed
    res = engine.generate(
        batch_prompts(engine, 1, length), max_new_tokens=1, temperature=0.0, stop_at_eos=False
    )
    pre = res.trace.prefill
    return Pass("prefill", f"prompt {length}", pre.flops, pre.bytes_moved, pre.forward_s), res


def decode_pass(engine, batch: int, s: RooflineSettings):
    engine.generate(batch_prompts(engine, batch, s.decode_prompt), max_new_tokens=2, stop_at_eos=False)  # warm-up: a GPU's first call of a new shape is slow (lazy init, kernel choice), so it is not timed
    res = engine.generate(
        batch_prompts(engine, batch, s.decode_prompt),
        max_new_tokens=s.new_tokens,
        temperature=0.0,
        stop_at_eos=False,
    )
    steps = res.trace.decode_steps
    return Pass(
        "decode",
        f"batch {batch}",
        median_of([st.flops for st in steps]),
        median_of([st.bytes_moved for st in steps]),
        median_of([st.forward_s for st in steps]),
    ), res


def theory_paths(engine, s: RooflineSettings, roof: Roofline) -> list[TheoryPoint]:
    """The analytic path each phase travels along the roofline as its knob turns.

    Prefill: batch 1, prompt 1 .. context (causal attention pairs). Decode: batch 1 .. 1024 at the
    decode prompt plus half the new tokens of context each. Costs come from `engine.costs` (the same
    model the trace uses), so the measured points sit on these paths' x-positions by construction;
    only their heights are measured. Each point's roof is the one its bytes fit under (`Roofline.home`).
    """
    cfg, nbytes = engine.cfg, getattr(torch, str(engine.info.dtype)).itemsize

    def point(phase: str, setting: int, c) -> TheoryPoint:
        home = roof.home(c.bytes_moved)
        return TheoryPoint(phase, setting, c.intensity, roof.attainable(c.intensity, home), roof.ridge_of(home))

    path = []
    for n in sorted({int(x) for x in np.geomspace(1, engine.info.max_context, 24)}):
        path.append(point("prefill", n, step_cost(cfg, 1, n, n, nbytes, logits_rows=1, attn_pairs=n * (n + 1) // 2)))
    ctx = s.decode_prompt + s.new_tokens // 2
    for b in (2**k for k in range(11)):
        path.append(point("decode", b, step_cost(cfg, b, b, b * ctx, nbytes, logits_rows=b)))
    return path


def run_roofline(engine, settings: RooflineSettings, on_progress: ProgressFn | None = None) -> RooflineResult:
    """Measure the roofs, then place prefill and decode steps under them."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    for n in settings.prompt_lens:
        check_fits(engine, n, 1, "roofline")
    check_fits(engine, settings.decode_prompt, settings.new_tokens, "roofline")
    lens, batches = sorted(set(settings.prompt_lens)), sorted(set(settings.batches))
    units = [sum(lens)] + list(lens) + [b * settings.new_tokens for b in batches] + [sum(lens)]
    tracker = ProgressTracker(units, on_progress)

    def measure_roof() -> Roofline:
        return measure_roofline(
            device=str(engine.info.device), dtype=str(engine.info.dtype), quick=settings.quick
        )

    first = measure_roof()
    tracker.step(
        f"roofs: {first.bandwidth_bytes_per_s / 1e9:.1f} GB/s, {first.flops_per_s / 1e9:.1f} GFLOP/s"
    )
    engine.generate(batch_prompts(engine, 1, 8), max_new_tokens=2, stop_at_eos=False)  # warm-up
    passes, last = [], None
    for n in lens:
        measured, last = prefill_pass(engine, n)
        passes.append(measured)
        tracker.step(f"prefill {n} tokens: {measured.flops / measured.forward_s / 1e9:.1f} GFLOP/s")
    for b in batches:
        measured, last = decode_pass(engine, b, settings)
        passes.append(measured)
        tracker.step(f"decode batch {b}: {measured.flops / measured.forward_s / 1e9:.1f} GFLOP/s")
    # A ceiling is what the machine *can* do: measure again and keep the best of each roof, so one
    # noisy moment on a shared machine cannot lower the roof under the points.
    roof = best_roof([first, measure_roof()])
    tracker.step(
        f"roofs again, best kept: {roof.bandwidth_bytes_per_s / 1e9:.1f} GB/s, "
        f"{roof.flops_per_s / 1e9:.1f} GFLOP/s"
    )
    points = [place(m.phase, m.label, m.flops, m.bytes_moved, m.forward_s, roof) for m in passes]
    notes = roof_notes(points, roof, engine.info.name, engine.info.weight_bytes)
    theory = theory_paths(engine, settings, roof)
    cross = next((t for t in theory if t.phase == "decode" and t.intensity >= t.ridge), None)
    notes.append(
        f"decode reaches the ridge ({cross.ridge:.1f} FLOP/byte) at batch {cross.setting} (analytic): memory-bound "
        f"below it, compute-bound from there"
        if cross
        else "decode stays left of the ridge up to batch 1024 (analytic): always memory-bound here"
    )
    return watch.stamp(RooflineResult(
        settings=settings,
        roof=roof,
        points=points,
        sample=sample_of(last, points[-1].label),
        notes=notes,
        theory=theory,
        model=engine.info.name,
    ))


# -- figures --------------------------------------------------------------------------------------


ROOF_STYLE = {"DRAM": dict(color="black", width=2), "L3": dict(color=GREY, width=2, dash="dash"),
              "L2": dict(color=GREY, width=1.5, dash="dot")}  # fmt: skip


def roof_name(m) -> str:
    size = f"{cache_mb(m.capacity_bytes)}, " if m.capacity_bytes else ""
    return f"{m.name} roof ({size}{m.bandwidth_bytes_per_s / 1e9:.0f} GB/s, measured)"


def roofline_figure(result, guess: float | None = None) -> go.Figure:
    roof, df = result.roof, result.to_frame()
    if "roof" not in df:  # a result measured before the cache roofs: every point under DRAM's
        df = df.assign(roof="DRAM", above_every_roof=False)
    xs_all = list(df.intensity) + [t.intensity for t in getattr(result, "theory", [])] + [roof.ridge]
    lo, hi = min(xs_all) / 2, max(xs_all) * 2
    xs = np.geomspace(lo, hi, 200)
    fig = go.Figure()
    for m in reversed(roof.memory_roofs()):  # DRAM first in the legend: the roof the story is about
        fig.add_trace(go.Scatter(x=xs, y=[roof.attainable(x, m) / 1e9 for x in xs], mode="lines", name=roof_name(m),
                                 line=ROOF_STYLE.get(m.name, dict(color=GREY, dash="dashdot"))))  # fmt: skip
    for phase, colour in (("prefill", WOK), ("decode", POT)):
        path = [t for t in getattr(result, "theory", []) if t.phase == phase]
        if path:  # the analytic path this phase travels as its knob (prompt length, batch) turns
            knob = "prompt" if phase == "prefill" else "batch"
            fig.add_trace(
                go.Scatter(
                    x=[t.intensity for t in path],
                    y=[t.attainable_flops_per_s / 1e9 for t in path],
                    mode="lines",
                    line=dict(color=colour, width=9),
                    opacity=0.25,
                    name=f"{phase} theory path ({knob} {path[0].setting}-{path[-1].setting})",
                    hovertext=[f"{knob} {t.setting}" for t in path],
                )
            )
        part = df[df.phase == phase].sort_values("intensity")
        # Theory: where its roof says each step could be, joined to its measurement by a dotted drop.
        xs_gap, ys_gap = [], []
        for x, top, got in zip(
            part.intensity, part.attainable_flops_per_s, part.achieved_flops_per_s, strict=True
        ):
            xs_gap += [x, x, None]
            ys_gap += [top / 1e9, got / 1e9, None]
        fig.add_trace(
            go.Scatter(
                x=xs_gap,
                y=ys_gap,
                mode="lines",
                line=dict(color=colour, dash="dot", width=1),
                showlegend=False,
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=part.intensity,
                y=part.attainable_flops_per_s / 1e9,
                mode="markers",
                name=f"{phase} theory (on its roof)",
                marker=dict(color=colour, symbol="circle-open", size=11),
            )
        )
        shares = ", ".join(f"{lab} {p:.0f}% of {r}" for lab, p, r in zip(part.label, part.pct_of_roof, part.roof, strict=True))
        fig.add_trace(  # each point's share of its roof is named in the legend: labels on the points collided
            go.Scatter(
                x=part.intensity,
                y=part.achieved_flops_per_s / 1e9,
                mode="markers",
                name=f"{phase} measured, share of its roof: {shares}",
                hovertext=[f"{lab}: {p:.0f}% of the {r} roof" for lab, p, r in zip(part.label, part.pct_of_roof, part.roof, strict=True)],
                marker=dict(color=colour, size=10, symbol=["x" if a else "circle" for a in part.above_every_roof]),
            )
        )
    if guess is not None:
        first = df[df.phase == "decode"].sort_values("intensity").iloc[0]
        fig.add_trace(
            guess_marker(
                first.intensity, first.attainable_flops_per_s / 1e9 * guess / 100, f"your guess: {guess:g}%"
            )
        )
    mark_x(fig, roof.ridge, f"ridge {roof.ridge:.1f} FLOP/B", log_x=True)
    fig.update_xaxes(title="arithmetic intensity (FLOP / byte, analytic)", type="log")
    fig.update_yaxes(title="GFLOP/s", type="log")
    bws = ", ".join(f"{m.name} {m.bandwidth_bytes_per_s / 1e9:.0f} GB/s" for m in reversed(roof.memory_roofs()))
    return finish(fig, f"Roofline of this machine ({bws}, {roof.flops_per_s / 1e9:.0f} GFLOP/s, measured now)")


# -- the experiment -------------------------------------------------------------------------------


def decode_pct(result) -> float:
    decode = [p for p in result.points if p.phase == "decode"]
    return min(decode, key=lambda p: p.intensity).pct_of_roof


def settings_form(ui, info) -> RooflineSettings:
    ctx = info.max_context - 1
    lens = tuple(n for n in (16, 64, 256, 1024) if n <= ctx)
    largest = ui.select_slider("Largest decode batch", options=[1, 4, 16, 64], value=16, key="roofline-batch")
    quick = ui.toggle("Quick roof measurement", value=True, key="roofline-quick")
    return RooflineSettings(
        prompt_lens=lens, batches=tuple(b for b in (1, 4, 16, 64) if b <= largest), quick=quick
    )


EXPERIMENT = Experiment(
    key="roofline",
    title="The roofline: what limits each pot?",
    nav_title="Roofline: what limits each pot",
    icon=":material/show_chart:",
    kitchen="Two limits rule any kitchen: how fast ingredients come through the pantry door (memory "
    "bandwidth) and how fast the cooks chop (compute). The wok chops a lot per armful fetched; the soup "
    "pot fetches the whole pantry for one spoonful.",
    engineering="We measure this machine's read bandwidth and matmul FLOP/s now, in the same run. Each step "
    "sits at its arithmetic intensity (analytic FLOPs / bytes); its height is the FLOP/s its forward pass "
    "achieved. Each step sits under the roof of the memory its bytes come from: DRAM, or a cache (L2, L3; measured "
    "too) when they fit in it. The open circle above it on that roof is the theory for that step; the legend gives "
    "the % of its roof achieved. A point above every roof is marked x and a line says why.",
    predict=Prediction(
        question="What % of its roof will a batch-1 decode step reach?",
        unit="%",
        min_value=0.0,
        max_value=1000.0,
        step=5.0,
        answer=decode_pct,
    ),
    form=settings_form,
    run=run_roofline,
    figures=lambda r, g: [roofline_figure(r, g)],
    record=lambda info: RooflineSettings(prompt_lens=(16, 64, 256), batches=(1, 4, 16, 64), quick=False),
    story=StoryLink(
        ":material/show_chart: Why the fire and the ladle differ",
        "The **roofline**: a step is limited either by memory bandwidth or by arithmetic, depending on how many "
        "FLOPs it does per byte it reads. Prefill sits right of the ridge, decode far left.",
        "Lab: roofline",
    ),
    verdict=decode_verdict,
    model=ASSISTANT,  # the pot reads its weights from memory only when they do not fit in a cache
)
