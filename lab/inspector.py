"""The kitchen inspector: from one run's measurements to a diagnosis and a fix.

The supervisor's handbook in code. Two questions, answered only from measured numbers:

1. Which pot made the guest wait? TTFT is the wok (prefill); everything after the first token is
   the soup pot (decode). A pot is named the bottleneck only past a stated margin: its phase takes
   at least BOTTLENECK_SHARE (60 %) of E2E. Between, the order is "balanced" and the verdict says
   both shares, so two orders that measure the same within their noise (say 52 % and 49 %) get the
   same words instead of flipping between "the wok" and "the soup pot".
2. If the pot is slow, what slows it? Each decode step is one of:
   - "overhead": most of the step is neither moving bytes nor doing FLOPs, it is Python, allocation,
     sampling, launches. Seen as (a) at least OVERHEAD_AT_LEAST (60 %) of the step outside the
     model's forward pass, or (b) with a roofline, the roof explains under a quarter of the step
     time. Between OVERHEAD_AT_MOST and OVERHEAD_AT_LEAST the step is called "about half
     overhead" rather than flipping on a few tenths of a millisecond.
   - "bandwidth": the step sits left of the ridge (FLOP/byte below the machine's ridge), so its
     speed limit is reading weights + KV cache.
   - "compute": the step sits right of the ridge (large batches), so FLOP/s is the limit.
   Without a measured roofline we cannot honestly tell bandwidth from compute, so unless overhead
   is obvious the answer is None and the evidence says to measure the roofline.

Worked example: TTFT 0.040 s, E2E 0.400 s, 60 decode steps of 6 ms each, forward 2 ms of each.
TTFT is 10 % of the wait (decode 90 % >= 60 %), so the pot is slow; 67 % of each step is outside
the forward pass, so the pot is overhead-bound: the fix is the portioning station (CUDA graphs,
fewer per-step chores). The headline quotes TPOT (the mean time per output token, the panels'
number); the evidence names the median step separately, labelled as the median.

An order that started from leftovers (`reused` prompt tokens taken from the prefix cache) says so
in the headline: its TTFT is short because the wok did not cook those tokens.

Advice follows this machine's measurements, never a general rule the numbers on screen could
contradict: "a smaller dtype reads fewer bytes" is offered as a fix only where a smaller dtype was
*measured* faster here (`dtype_tpot`: the median TPOT per dtype of this model, device and batch,
from the server's run log); where it measured slower the inspector says so, and where it was not
measured it says how to measure it. "Split the banquet" needs a banquet (batch > 1). A lesson about
the pot (`focus="decode"`: the Roofline and More tables labs) gets the pot's diagnosis even when
its sample run's TTFT was the larger part.

The serving labs ask about a whole stream of orders, not one run, so they have their own verdicts
at the end (`diagnose_rush`, `diagnose_stall`, `diagnose_leftovers`), each from a few measured
numbers named in a small dataclass, with its threshold stated once beside it.

Pure functions, no engine, no Streamlit: the kitchen page and the lab pages both call them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Literal

from engine.trace import Metrics, StepRecord, Trace
from lab.units import fmt_s, fmt_tps, reused_words

if TYPE_CHECKING:  # the roofline module is optional at import time; we only read its fields
    from engine.bench.roofline import Roofline

# Thresholds, stated once so the page can show them.
BOTTLENECK_SHARE = 0.60  # a phase >= 60 % of E2E is the bottleneck; below that for both: balanced
OVERHEAD_AT_LEAST = 0.60  # >= 60 % of the step outside forward() -> overhead-bound
OVERHEAD_AT_MOST = 0.40  # <= 40 % outside -> the model's own work; between: about half each
ROOF_EXPLAINS_AT_LEAST = 0.25  # roof time < 25 % of the step -> the rest is overhead
PADDING_WORTH_FIXING = 0.10  # > 10 % of prefill slots were padding -> suggest packing


@dataclass(frozen=True)
class Verdict:
    headline: str  # one line for the page
    slow_phase: Literal["prefill", "decode", "balanced"]
    decode_bound: Literal["bandwidth", "compute", "overhead"] | None
    fixes: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # the measured numbers the verdict used


@dataclass(frozen=True)
class DecodeProfile:
    """Medians over the decode steps: what a typical ladle of soup cost."""

    steps: int
    step_s: float
    forward_s: float
    outside_share: float  # fraction of the step spent outside the forward pass
    intensity: float  # analytic FLOP/byte
    tokens_per_seq: float  # tokens fed per sequence per step: 1 with a KV cache, the history without
    kv_mb: float


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def profile_decode(steps: list[StepRecord]) -> DecodeProfile | None:
    if not steps:
        return None
    return DecodeProfile(
        steps=len(steps),
        step_s=median(s.seconds for s in steps),
        forward_s=median(s.forward_s for s in steps),
        outside_share=median(max(0.0, 1 - s.forward_s / s.seconds) if s.seconds > 0 else 0.0 for s in steps),
        intensity=median(s.intensity for s in steps),
        tokens_per_seq=median(s.tokens / max(1, s.batch) for s in steps),
        kv_mb=max(s.kv_bytes for s in steps) / 1e6,
    )


def roof_time_s(step: StepRecord, roof: Roofline) -> float:
    """The least time this step could take on this machine: the slower of its bytes (read from the
    memory they fit in: DRAM, or a cache whose roof was measured) and its FLOPs."""
    return max(step.bytes_moved / roof.home(step.bytes_moved).bandwidth_bytes_per_s, step.flops / roof.flops_per_s)


@dataclass(frozen=True)
class Regime:
    """Which side of the ridge the pot's step sits on, with the numbers that say so.

    Worked example (the assistant in float32, 538 MB of weights, DRAM ridge 2.8 FLOP/byte): at batch
    1 a step does 0.27 GFLOP over 540 MB = 0.50 FLOP/byte, memory-bound; each more table adds 2
    FLOPs per weight read, so about batch 6 reaches the ridge and the pot turns compute-bound."""

    bound: Literal["bandwidth", "compute"]
    batch: int
    intensity: float  # FLOP/byte of the step
    ridge: float  # FLOP/byte where its memory roof meets the compute roof
    memory: str  # the roof its bytes come through: "DRAM", "L3", ...
    crossing: int | None  # the batch whose step reaches the ridge at this context; None: none does

    def summary(self) -> str:
        """The evidence's line: "memory-bound at batch 1: 0.50 FLOP/byte, left of the DRAM ridge at 2.8
        FLOP/byte; compute-bound from about batch 6"."""
        ridge = f"the {self.memory} ridge at {self.ridge:.1f} FLOP/byte"
        if self.bound == "compute":
            small = f"memory-bound below about batch {self.crossing}" if self.crossing and self.crossing > 1 else (
                "compute-bound even at batch 1")  # fmt: skip
            return f"compute-bound at batch {self.batch}: {self.intensity:.1f} FLOP/byte, right of {ridge}; {small}"
        turn = f"compute-bound from about batch {self.crossing}" if self.crossing else "memory-bound at any batch"
        return f"memory-bound at batch {self.batch}: {self.intensity:.2f} FLOP/byte, left of {ridge}; {turn}"

    def words(self) -> str:
        """The headline's reason: the regime named with its numbers (the evidence's line after the
        headline's usual words, so the story's pot and the screen's agree)."""
        if self.bound == "compute":
            numbers = self.summary().split(": ", 1)[1]  # without "compute-bound at batch N"
            return f"each step is compute-bound at this batch: {self.batch} tables share each weight read, {numbers}"
        return f"each step waits on reading weights and KV cache, like the story's pot: {self.summary()}"


def regime(step: StepRecord, roof: Roofline) -> Regime:
    """The step's side of the ridge, and the batch where its pot would cross it at this context.

    A step reads W bytes of weights once whatever the batch, plus about its KV cache (kv_bytes) per
    table, and does F / batch FLOPs per table: intensity(b) = b f / (W + b k) reaches the ridge R at
    b = R W / (f - R k) (never when f <= R k: the KV cache alone outweighs the FLOPs)."""
    memory = roof.home(step.bytes_moved)
    ridge = roof.ridge_of(memory)
    b = max(step.batch, 1)
    f, k = step.flops / b, step.kv_bytes / b
    weights = max(step.bytes_moved - step.kv_bytes, 0.0)
    crossing = max(1, math.ceil(ridge * weights / (f - ridge * k))) if f > ridge * k else None
    bound = "bandwidth" if step.intensity < ridge else "compute"
    return Regime(bound, step.batch, step.intensity, ridge, memory.name, crossing)


def classify_decode(
    steps: list[StepRecord], prof: DecodeProfile, roof: Roofline | None, evidence: list[str]
) -> Literal["bandwidth", "compute", "overhead"] | None:
    """Overhead first (it hides the other two), then the side of the ridge the step sits on."""
    evidence.append(
        f"decode step median {ms(prof.step_s)}, forward pass {ms(prof.forward_s)} "
        f"({prof.outside_share:.0%} outside the forward pass)"
    )
    if prof.outside_share >= OVERHEAD_AT_LEAST:
        return "overhead"
    if prof.outside_share > OVERHEAD_AT_MOST:
        evidence.append(
            f"about half of each step is outside the forward pass ({prof.outside_share:.0%}, between "
            f"{OVERHEAD_AT_MOST:.0%} and {OVERHEAD_AT_LEAST:.0%}): overhead and the model's work weigh about equally"
        )
        return None
    if roof is None:
        evidence.append("no roofline measured: cannot tell bandwidth- from compute-bound")
        return None
    explained = median(roof_time_s(s, roof) / s.seconds for s in steps if s.seconds > 0)
    step = steps[len(steps) // 2]
    here = regime(step, roof)
    fits = "" if here.memory == "DRAM" else f", whose roof was measured: its {step.bytes_moved / 1e6:,.0f} MB fit there"
    evidence.append(
        f"decode intensity {prof.intensity:.2f} FLOP/byte vs ridge {here.ridge:.1f} FLOP/byte (its bytes come "
        f"from {here.memory}{fits}); the roof explains {explained:.0%} of the step time"
    )
    evidence.append(f"by its intensity alone the pot is {here.summary()}")
    if explained > 1 and here.bound == "compute":
        evidence.append(
            f"the step beat the measured compute roof ({roof.flops_per_s / 1e9:.1f} GFLOP/s, a square matrix "
            "multiply): the roof was measured in a slower moment, or this step's shapes run faster than that one"
        )
    elif explained > 1:
        evidence.append(
            f"the step beat the measured memory roof ({here.memory}): part of its weights and KV cache stayed in a "
            "faster cache, or the roof was measured in a slower moment"
        )
    if explained < ROOF_EXPLAINS_AT_LEAST:
        return "overhead"
    return here.bound


def prefill_fixes(pre: StepRecord, evidence: list[str]) -> list[str]:
    fixes = [
        f"Shorten the prompt: the wok tossed {pre.tokens} prompt tokens; its work grows with length, "
        "and attention's share grows with length squared.",
    ]
    if pre.batch > 1:
        fixes.append(
            f"Split the banquet: {pre.batch} sequences went into one pass; smaller batches give each "
            "guest an earlier first dish (at some cost in throughput)."
        )
    padding = 1 - pre.tokens / pre.slots if pre.slots else 0.0
    evidence.append(
        f"prefill computed {pre.slots} slots for {pre.tokens} real tokens ({padding:.0%} padding)"
    )
    if padding > PADDING_WORTH_FIXING:
        fixes.append(
            f"Pack instead of pad: {padding:.0%} of the wok's slots were padding (batching='packed')."
        )
    fixes.append("Raise prefill parallelism: more cores or a GPU; chunk very long prompts.")
    return fixes


SMALLER = {"float32": ("bfloat16", "float16", "int8"), "bfloat16": ("int8",), "float16": ("int8",), "int8": ()}


def dtype_advice(dtype: str | None, dtype_tpot: dict[str, float] | None) -> str | None:
    """What this machine measured about a smaller dtype for the pot, as one line (None: nothing to say).

    Example: float32 2.6 ms, bfloat16 4.5 ms measured -> "bfloat16 measured slower here ..." (no
    "halves weight reads" advice where the numbers on screen say the opposite).
    """
    if dtype is None or not SMALLER.get(dtype):
        return None
    tpot = dtype_tpot or {}
    here = tpot.get(dtype)
    measured = [(d, tpot[d]) for d in SMALLER[dtype] if d in tpot and tpot[d] > 0]
    if here and measured:
        best, best_s = min(measured, key=lambda x: x[1])
        if best_s < here:
            return (
                f"Read fewer bytes per step: {best} measured TPOT {ms(best_s)} against {ms(here)} in "
                f"{dtype} on this machine (same model and batch), so a smaller dtype does help here."
            )
        slower = ", ".join(f"{d} {ms(t)}" for d, t in measured)
        return (
            f"A smaller dtype does not help this pot here: measured TPOT {slower} against {ms(here)} in "
            f"{dtype} (same model and batch; without native support for it the CPU converts on every step)."
        )
    return (
        f"A smaller dtype reads fewer bytes per step, but whether it is faster on this machine is not "
        f"measured yet: switch Precision to {SMALLER[dtype][0]} and Cook the same order to compare TPOT."
    )


def decode_fixes(
    bound: str | None,
    prof: DecodeProfile,
    dtype: str | None = None,
    dtype_tpot: dict[str, float] | None = None,
) -> list[str]:
    fixes: list[str] = []
    if prof.tokens_per_seq > 1.5:
        fixes.append(
            f"Use a KV cache: each step re-fed {prof.tokens_per_seq:.0f} tokens per sequence "
            "(cache='none' recooks the whole soup every ladle)."
        )
    if bound == "overhead":
        fixes += [
            f"Cut per-step overhead: the model's compute is only part of each {ms(prof.step_s)} step "
            "(Python, allocation, sampling, sync).",
            "On GPU, replay the step as a CUDA graph (cuda_graph=True); keep cache='static' to avoid "
            "per-step allocation.",
        ]
    elif bound == "bandwidth":
        advice = dtype_advice(dtype, dtype_tpot)
        fixes += [advice] if advice else []
        fixes += [
            f"Share each weight read across more sequences (batch more); KV cache now {prof.kv_mb:.1f} MB.",
            "Try speculative decoding: verify several tokens per pass over the weights.",
        ]
    elif bound == "compute":
        fixes += [
            "The pot is compute-bound at this batch: fewer sequences per step lower each step's latency.",
            "More FLOP/s helps here (a faster device); bandwidth tricks will not.",
        ]
    else:
        fixes.append("Measure the roofline to see whether the pot waits on bytes or on FLOPs.")
    return fixes


def diagnose(
    metrics: Metrics,
    trace: Trace,
    roof: Roofline | None = None,
    *,
    dtype: str | None = None,
    dtype_tpot: dict[str, float] | None = None,
    focus: Literal["decode"] | None = None,
    reused: int = 0,
    prompt_tokens: int = 0,
) -> Verdict:
    """Which pot is slow, why, and what to try, from one run's metrics and trace.

    `dtype` is the run's precision and `dtype_tpot` what this machine measured per dtype (see the
    module's notes); `focus="decode"` diagnoses the pot whatever the wok's share (a lesson about
    the pot). `reused` of `prompt_tokens` were taken from leftovers, not cooked."""
    e2e = metrics.e2e_s
    ttft_share = metrics.ttft_s / e2e if e2e > 0 else 1.0
    decode_s = max(0.0, e2e - metrics.ttft_s)
    evidence = [
        f"TTFT {fmt_s(metrics.ttft_s)} of E2E {fmt_s(e2e)} ({ttft_share:.0%}); decode {fmt_s(decode_s)} "
        f"({1 - ttft_share:.0%}); a phase is the bottleneck from {BOTTLENECK_SHARE:.0%} of E2E",
        f"the wok cooked {metrics.prefill_tokens:,} tokens at {fmt_tps(metrics.prefill_tps)}; "
        f"the pot: TPOT {fmt_s(metrics.tpot_s)} (mean), {fmt_tps(metrics.decode_tps)} over all tables",
    ]
    leftovers = reused_words(reused, prompt_tokens) if prompt_tokens else ""
    if leftovers:
        evidence.append(f"{leftovers}: the wok's time covers only the rest")
    steps = trace.decode_steps
    prof = profile_decode(steps)
    bound = classify_decode(steps, prof, roof, evidence) if prof else None
    if focus == "decode" and prof is not None:
        slow_phase = "decode"
    elif prof is None or ttft_share >= BOTTLENECK_SHARE:
        slow_phase = "prefill"
    elif 1 - ttft_share >= BOTTLENECK_SHARE:
        slow_phase = "decode"
    else:
        slow_phase = "balanced"
    why = {
        "overhead": "each step is mostly per-step overhead; trim the portioning",
        "bandwidth": "each step waits on reading weights and KV cache",  # with a roof, `Regime.words` says more
        "compute": "each step is compute-bound at this batch",
        None: "about half of each step is overhead" if prof and prof.outside_share > OVERHEAD_AT_MOST
        else "measure the roofline to see why",
    }[bound]
    here = regime(steps[len(steps) // 2], roof) if bound in ("bandwidth", "compute") and roof is not None else None
    if here is not None:  # the regime named with its numbers, as the story tells it
        why = here.words()
    tail = f" ({leftovers})" if leftovers else ""
    if slow_phase == "prefill":
        pre = trace.prefill
        fixes = prefill_fixes(pre, evidence) if pre is not None else []
        headline = (
            f"TTFT is {ttft_share:.0%} of the wait: the wok is the bottleneck; "
            f"shorter prompts or smaller batches help{tail}"
        )
    elif slow_phase == "balanced":
        pre = trace.prefill
        fixes = (prefill_fixes(pre, evidence) if pre is not None else [])[:1] + decode_fixes(bound, prof, dtype, dtype_tpot)
        pot = f"; the soup pot: {here.summary()}" if here is not None else ""
        headline = (
            f"Balanced: the wok took {ttft_share:.0%} of the wait and the soup pot {1 - ttft_share:.0%}; "
            f"neither reaches {BOTTLENECK_SHARE:.0%}, so both matter for this order{tail}{pot}"
        )
    else:
        fixes = decode_fixes(bound, prof, dtype, dtype_tpot)
        if ttft_share >= 1 - BOTTLENECK_SHARE:  # a lesson about the pot, on a run where it is not the bottleneck
            headline = (
                f"The soup pot ({prof.steps} steps, TPOT {fmt_s(metrics.tpot_s)}; decode {1 - ttft_share:.0%} of "
                f"this run's wait): {why}{tail}"
            )
        else:
            headline = (
                f"Decode is {1 - ttft_share:.0%} of the wait ({prof.steps} steps, TPOT {fmt_s(metrics.tpot_s)}): "
                f"the soup pot is the bottleneck; {why}{tail}"
            )
    return Verdict(
        headline=headline, slow_phase=slow_phase, decode_bound=bound, fixes=fixes, evidence=evidence
    )
