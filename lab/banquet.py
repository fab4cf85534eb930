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

Measured: for each prompt length, `repeats` single-token generations (max_new_tokens=1), median
TTFT, median prefill pass time (wall) and median prefill CPU time (`lab.cpu_time`). The saturation
mark is the first length whose prefill tokens/s
reaches `SATURATION` (90 %) of the best measured tokens/s.

Analytic (not measured, labelled so): attention's share of the prefill FLOPs, from the engine's cost
model for this model's shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from engine.costs import step_cost
from lab.cpu_time import busy_note, generate_timed
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.sample import Sample, sample_of
from lab.workload import check_fits, prompt_ids

SATURATION = 0.9  # the wok is "saturated" once tokens/s is within 10 % of the best seen


@dataclass(frozen=True)
class BanquetSettings:
    lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
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


@dataclass(frozen=True)
class BanquetResult:
    settings: BanquetSettings
    points: list[BanquetPoint]
    saturation_tokens: int | None  # the prompt length where the wok saturates
    sample: Sample
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"  # CPU time is the work's own cost only when the work runs on the CPU

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(p) for p in self.points])


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


def saturation_point(points: list[BanquetPoint], on_cpu: bool) -> int | None:
    """The first prompt length whose tokens/s is within 10 % of the best: the wok is full.

    On a CPU, tokens per CPU-second (the work's own rate) decides, so a neighbour's burst during one
    length cannot move the mark; elsewhere, wall-clock tokens/s.
    """
    if not points:
        return None
    rate = [
        p.prompt_tokens / p.prefill_cpu_s if on_cpu and p.prefill_cpu_s > 0 else p.prefill_tps for p in points
    ]
    best = max(rate)
    return next(p.prompt_tokens for p, r in zip(points, rate, strict=True) if r >= SATURATION * best)


def measure_length(engine, length: int, repeats: int) -> tuple[BanquetPoint, Sample]:
    ids = prompt_ids(engine, length)
    timed = [
        generate_timed(engine, [ids], max_new_tokens=1, temperature=0.0, stop_at_eos=False)
        for _ in range(repeats)
    ]
    runs = [t.result for t in timed]
    prefill_s = median_of([r.trace.prefill.seconds for r in runs])
    point = BanquetPoint(
        prompt_tokens=length,
        ttft_s=median_of([r.metrics.ttft_s for r in runs]),
        prefill_s=prefill_s,
        prefill_tps=length / prefill_s if prefill_s > 0 else 0.0,
        us_per_token=prefill_s / length * 1e6,
        prefill_cpu_s=median_of([t.prefill_cpu_s for t in timed]),
        attention_share=attention_share(engine.cfg, length),
        flops=runs[0].trace.prefill.flops,
    )
    return point, sample_of(runs[-1], f"prompt {length} tokens")


def run_banquet(engine, settings: BanquetSettings, on_progress: ProgressFn | None = None) -> BanquetResult:
    """TTFT and prefill tokens/s for each prompt length, shortest first."""
    lengths = sorted(set(settings.lengths))
    for n in lengths:
        check_fits(engine, n, 1, "big banquet")
    tracker = ProgressTracker([n * settings.repeats for n in lengths], on_progress)
    engine.generate([prompt_ids(engine, lengths[0])], max_new_tokens=1, stop_at_eos=False)  # warm-up
    points, sample = [], None
    for n in lengths:
        point, sample = measure_length(engine, n, max(1, settings.repeats))
        points.append(point)
        tracker.step(f"prompt {n} tokens: TTFT {point.ttft_s * 1e3:.1f} ms")
    on_cpu = str(engine.info.device).startswith("cpu")
    sat = saturation_point(points, on_cpu)
    rate = "tokens per CPU-second" if on_cpu else "tokens/s"
    notes = [
        f"{rate} reaches {SATURATION:.0%} of its best at {sat} prompt tokens: the wok is full from there",
        f"attention's share of prefill FLOPs (analytic) grows from {points[0].attention_share:.0%} "
        f"at {points[0].prompt_tokens} tokens to {points[-1].attention_share:.0%} "
        f"at {points[-1].prompt_tokens}",
    ]
    busy = busy_note(
        sum(p.prefill_s for p in points), sum(p.prefill_cpu_s for p in points), engine.info.device
    )
    notes += [busy] if busy else []
    return BanquetResult(
        settings=settings,
        points=points,
        saturation_tokens=sat,
        sample=sample,
        notes=notes,
        device=str(engine.info.device),
    )
