"""Experiment 3, the roofline: each pot's steps placed under this machine's two ceilings.

Kitchen words: the kitchen has two limits: how fast ingredients arrive from the pantry (memory
bandwidth) and how fast the cooks can chop (compute). The wok chops a lot per armful fetched; it
is limited by the cooks. The soup pot fetches the whole pantry for one spoonful; it is limited by
the pantry door.

Engine words: a pass with F FLOPs and B bytes has intensity I = F / B. The machine can reach at
most min(peak FLOP/s, bandwidth x I). Both roofs are measured in this same run
(`engine.roofline.measure_roofline`), not read off a spec sheet. Each measured step is placed at
its analytic I (from `engine.costs`, carried in the trace) and its achieved FLOP/s = F / forward
time. The theory point sits straight above it on the roof; the gap is the % of roof achieved.

Measured: prefill passes for each prompt length (batch 1, prefill only) and decode steps for each
batch size (median over the steps of one generation). Times are the forward pass alone, so
sampling and bookkeeping are not counted against the roof (the portioning-station page measures
those). A small model's weights can sit in the CPU cache, so a decode step can beat the DRAM
bandwidth roof: that is reported as measured (>100 %), not hidden.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from engine.roofline import Roofline, measure_roofline
from lab.progress import ProgressFn, ProgressTracker, median_of
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
    attainable_flops_per_s: float  # the roof at this intensity
    pct_of_roof: float  # achieved / attainable, in %
    theory_s: float  # the least time the roof allows: max(F / peak, B / bandwidth)


@dataclass(frozen=True)
class RooflineResult:
    settings: RooflineSettings
    roof: Roofline
    points: list[RoofPoint]
    sample: Sample
    notes: list[str] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(p) for p in self.points])


def place(
    phase: str, label: str, flops: float, bytes_moved: float, forward_s: float, roof: Roofline
) -> RoofPoint:
    intensity = flops / bytes_moved if bytes_moved else 0.0
    achieved = flops / forward_s if forward_s > 0 else 0.0
    attainable = roof.attainable(intensity)
    return RoofPoint(
        phase=phase,
        label=label,
        intensity=intensity,
        flops=flops,
        bytes_moved=bytes_moved,
        forward_s=forward_s,
        achieved_flops_per_s=achieved,
        attainable_flops_per_s=attainable,
        pct_of_roof=100 * achieved / attainable if attainable > 0 else 0.0,
        theory_s=max(flops / roof.flops_per_s, bytes_moved / roof.bandwidth_bytes_per_s),
    )


def prefill_point(engine, length: int, roof: Roofline):
    res = engine.generate(
        batch_prompts(engine, 1, length), max_new_tokens=1, temperature=0.0, stop_at_eos=False
    )
    pre = res.trace.prefill
    return place("prefill", f"prompt {length}", pre.flops, pre.bytes_moved, pre.forward_s, roof), res


def decode_point(engine, batch: int, s: RooflineSettings, roof: Roofline):
    res = engine.generate(batch_prompts(engine, batch, s.decode_prompt), max_new_tokens=s.new_tokens,
                          temperature=0.0, stop_at_eos=False)  # fmt: skip
    steps = res.trace.decode_steps
    point = place(
        "decode",
        f"batch {batch}",
        median_of([st.flops for st in steps]),
        median_of([st.bytes_moved for st in steps]),
        median_of([st.forward_s for st in steps]),
        roof,
    )
    return point, res


def run_roofline(engine, settings: RooflineSettings, on_progress: ProgressFn | None = None) -> RooflineResult:
    """Measure the roofs, then place prefill and decode steps under them."""
    for n in settings.prompt_lens:
        check_fits(engine, n, 1, "roofline")
    check_fits(engine, settings.decode_prompt, settings.new_tokens, "roofline")
    lens, batches = sorted(set(settings.prompt_lens)), sorted(set(settings.batches))
    units = [sum(lens)] + list(lens) + [b * settings.new_tokens for b in batches]
    tracker = ProgressTracker(units, on_progress)
    roof = measure_roofline(
        device=str(engine.info.device), dtype=str(engine.info.dtype), quick=settings.quick
    )
    tracker.step(f"roofs: {roof.bandwidth_bytes_per_s / 1e9:.1f} GB/s, {roof.flops_per_s / 1e9:.1f} GFLOP/s")
    engine.generate(batch_prompts(engine, 1, 8), max_new_tokens=2, stop_at_eos=False)  # warm-up
    points, last = [], None
    for n in lens:
        point, last = prefill_point(engine, n, roof)
        points.append(point)
        tracker.step(f"prefill {n} tokens: {point.pct_of_roof:.0f}% of roof")
    for b in batches:
        point, last = decode_point(engine, b, settings, roof)
        points.append(point)
        tracker.step(f"decode batch {b}: {point.pct_of_roof:.0f}% of roof")
    notes = [
        f"ridge at {roof.ridge:.1f} FLOP/byte: left of it a pass is memory-bound, right of it compute-bound"
    ]
    notes += [
        f"{p.phase} {p.label}: {p.intensity:.2f} FLOP/byte, {p.achieved_flops_per_s / 1e9:.2f} GFLOP/s = "
        f"{p.pct_of_roof:.0f}% of the roof there"
        for p in points
    ]
    return RooflineResult(settings=settings, roof=roof, points=points, sample=sample_of(last, points[-1].label),
                          notes=notes)  # fmt: skip
