"""The kitchen inspector: from one run's measurements to a diagnosis and a fix.

The supervisor's handbook in code. Two questions, answered only from measured numbers:

1. Which pot made the guest wait? TTFT is the wok (prefill); everything after the first token is
   the soup pot (decode). If TTFT is at least half of E2E, the wok is the bottleneck.
2. If the pot is slow, what slows it? Each decode step is one of:
   - "overhead": most of the step is neither moving bytes nor doing FLOPs, it is Python, allocation,
     sampling, launches. Seen as (a) a large share of the step outside the model's forward pass, or
     (b) with a roofline, the roof explains under a quarter of the step time.
   - "bandwidth": the step sits left of the ridge (FLOP/byte below the machine's ridge), so its
     speed limit is reading weights + KV cache.
   - "compute": the step sits right of the ridge (large batches), so FLOP/s is the limit.
   Without a measured roofline we cannot honestly tell bandwidth from compute, so unless overhead
   is obvious the answer is None and the evidence says to measure the roofline.

Worked example: TTFT 0.040 s, E2E 0.400 s, 60 decode steps of 6 ms each, forward 2 ms of each.
TTFT is 10 % of the wait, so the pot is slow; 67 % of each step is outside the forward pass, so
the pot is overhead-bound: the fix is the portioning station (CUDA graphs, fewer per-step chores).

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

from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Literal

from engine.trace import Metrics, StepRecord, Trace

if TYPE_CHECKING:  # the roofline module is optional at import time; we only read its fields
    from bench.roofline import Roofline

# Thresholds, stated once so the page can show them.
OUTSIDE_FORWARD_OVERHEAD = 0.5  # >= half the step outside forward() -> overhead-bound
ROOF_EXPLAINS_AT_LEAST = 0.25  # roof time < 25 % of the step -> the rest is overhead
PADDING_WORTH_FIXING = 0.10  # > 10 % of prefill slots were padding -> suggest packing


@dataclass(frozen=True)
class Verdict:
    headline: str  # one line for the page
    slow_phase: Literal["prefill", "decode"]
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
    """The least time this step could take on this machine: the slower of its bytes and its FLOPs."""
    return max(step.bytes_moved / roof.bandwidth_bytes_per_s, step.flops / roof.flops_per_s)


def classify_decode(
    steps: list[StepRecord], prof: DecodeProfile, roof: Roofline | None, evidence: list[str]
) -> Literal["bandwidth", "compute", "overhead"] | None:
    """Overhead first (it hides the other two), then the side of the ridge the step sits on."""
    evidence.append(
        f"decode step median {ms(prof.step_s)}, forward pass {ms(prof.forward_s)} "
        f"({prof.outside_share:.0%} outside the forward pass)"
    )
    if prof.outside_share >= OUTSIDE_FORWARD_OVERHEAD:
        return "overhead"
    if roof is None:
        evidence.append("no roofline measured: cannot tell bandwidth- from compute-bound")
        return None
    explained = median(roof_time_s(s, roof) / s.seconds for s in steps if s.seconds > 0)
    evidence.append(
        f"decode intensity {prof.intensity:.2f} FLOP/byte vs ridge {roof.ridge:.1f} FLOP/byte; "
        f"the roof explains {explained:.0%} of the step time"
    )
    if explained > 1:
        evidence.append(
            "the step beat the measured memory roof: its weights and KV cache fit in a CPU/GPU cache"
        )
    if explained < ROOF_EXPLAINS_AT_LEAST:
        return "overhead"
    return "bandwidth" if prof.intensity < roof.ridge else "compute"


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
) -> Verdict:
    """Which pot is slow, why, and what to try, from one run's metrics and trace.

    `dtype` is the run's precision and `dtype_tpot` what this machine measured per dtype (see the
    module's notes); `focus="decode"` diagnoses the pot whatever the wok's share (a lesson about
    the pot)."""
    e2e = metrics.e2e_s
    ttft_share = metrics.ttft_s / e2e if e2e > 0 else 1.0
    decode_s = max(0.0, e2e - metrics.ttft_s)
    evidence = [
        f"TTFT {ms(metrics.ttft_s)} of E2E {ms(e2e)} ({ttft_share:.0%}); decode {ms(decode_s)}",
        f"prefill {metrics.prefill_tokens} tokens at {metrics.prefill_tps:.0f} tok/s; "
        f"decode {metrics.decode_tps:.1f} tok/s, TPOT {ms(metrics.tpot_s)}",
    ]
    steps = trace.decode_steps
    prof = profile_decode(steps)
    bound = classify_decode(steps, prof, roof, evidence) if prof else None
    slow_phase = "prefill" if (ttft_share >= 0.5 and focus != "decode") or prof is None else "decode"
    if slow_phase == "prefill":
        pre = trace.prefill
        fixes = prefill_fixes(pre, evidence) if pre is not None else []
        headline = (
            f"TTFT is {ttft_share:.0%} of the wait: the wok is the bottleneck; "
            "shorter prompts or smaller batches help"
        )
    else:
        fixes = decode_fixes(bound, prof, dtype, dtype_tpot)
        why = {
            "overhead": "each step is mostly per-step overhead; trim the portioning",
            "bandwidth": "each step waits on reading weights and KV cache",
            "compute": "each step is compute-bound at this batch",
            None: "measure the roofline to see why",
        }[bound]
        if ttft_share >= 0.5:  # a lesson about the pot, on a run where the wok took longer
            headline = (
                f"The soup pot ({prof.steps} steps, {ms(prof.step_s)} each; decode {1 - ttft_share:.0%} of "
                f"this run's wait): {why}"
            )
        else:
            headline = (
                f"Decode is {1 - ttft_share:.0%} of the wait ({prof.steps} steps, "
                f"{ms(prof.step_s)} each): the soup pot is the bottleneck; {why}"
            )
    return Verdict(
        headline=headline, slow_phase=slow_phase, decode_bound=bound, fixes=fixes, evidence=evidence
    )


# -- serving verdicts: the dinner rush, the stalled pot, the leftovers ------------------------------
# Each reads a few measured numbers of whole request streams (not one run's trace); tests build them.

SERVING_GAIN = 1.2  # one policy "serves more" when it reaches >= 1.2x the other's requests/s
STALL_SPIKE = 2.0  # the pot "stalls" when a gap between tokens is >= 2x the usual (median) gap
LEFTOVERS_GOAL = 0.3  # issue 13: an order with 90 % of its prompt cached: TTFT <= 0.3x cold


@dataclass(frozen=True)
class PolicyNumbers:
    """One policy's run of a request stream, as the rush verdict reads it (seconds)."""

    policy: str
    requests_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    e2e_p50_s: float


def diagnose_rush(static: PolicyNumbers, continuous: PolicyNumbers) -> Verdict:
    """Did letting tickets join mid-service (continuous) serve more guests than whole batches (static)?"""
    gain = continuous.requests_per_s / static.requests_per_s
    evidence = [
        f"{p.policy}: {p.requests_per_s:.2f} requests/s, TTFT p50 {ms(p.ttft_p50_s)} / p99 {ms(p.ttft_p99_s)}, "
        f"TPOT p50 {ms(p.tpot_p50_s)}"
        for p in (static, continuous)
    ]
    fixes = []
    if gain >= SERVING_GAIN:
        headline = (
            f"Continuous batching served {gain:.1f}x the requests/s of static: new tickets join the pot "
            "mid-service instead of waiting for the batch's slowest bowl"
        )
        if continuous.tpot_p50_s > SERVING_GAIN * static.tpot_p50_s:
            fixes.append(
                f"Each ladle got {continuous.tpot_p50_s / static.tpot_p50_s:.1f}x slower in the fuller pot "
                "(TPOT p50): cap max_seqs where the rhythm of the words matters more than guests per second."
            )
        if continuous.ttft_p99_s > 5 * continuous.ttft_p50_s:
            fixes.append(
                f"A few tickets still waited long (TTFT p99 {ms(continuous.ttft_p99_s)}): a long prompt "
                "holds the stove for a whole step; chunked prefill spreads it (Don't stall the pot)."
            )
        fixes.append("Keep continuous batching: static only keeps up when every order has the same length.")
    elif gain <= 1 / SERVING_GAIN:
        headline = f"Static batching served {1 / gain:.1f}x the requests/s of continuous on this stream"
        fixes.append("Look at the timeline: whole batches only win when all orders finish together.")
    else:
        headline = (
            f"The rush was too light to tell them apart: continuous served {gain:.2f}x static's requests/s"
        )
        fixes.append(
            "Raise the arrival rate or mix in a few long orders: the gap opens when the pot is full."
        )
    slow = "prefill" if continuous.ttft_p50_s >= 0.5 * continuous.e2e_p50_s else "decode"
    return Verdict(headline=headline, slow_phase=slow, decode_bound=None, fixes=fixes, evidence=evidence)


@dataclass(frozen=True)
class StallNumbers:
    """One run of the interference lesson: the banquet's TTFT and the decoding tables' gaps (seconds)."""

    policy: str  # "continuous" or "chunked"
    token_budget: int
    banquet_ttft_s: float
    itl_p50_s: float  # the tables' usual gap between tokens
    itl_max_s: float  # their worst gap (the stall, if any)

    @property
    def spike(self) -> float:
        return self.itl_max_s / self.itl_p50_s


def diagnose_stall(runs: list[StallNumbers]) -> Verdict:
    """Did the banquet stall the pot under continuous, and which chunk budget flattens it at what TTFT?"""
    cont = next(r for r in runs if r.policy == "continuous")
    chunked = sorted((r for r in runs if r.policy == "chunked"), key=lambda r: r.token_budget)
    evidence = [
        f"{r.policy}{f' (budget {r.token_budget})' if r.policy == 'chunked' else ''}: banquet TTFT "
        f"{ms(r.banquet_ttft_s)}; tables' gap p50 {ms(r.itl_p50_s)}, worst {ms(r.itl_max_s)} ({r.spike:.1f}x)"
        for r in [cont, *chunked]
    ]
    flat = [r for r in chunked if r.spike < STALL_SPIKE]
    fixes = []
    if cont.spike < STALL_SPIKE:
        headline = (
            f"No stall to fix: under continuous the tables' worst gap was {cont.spike:.1f}x their usual one; "
            "this banquet was too small to hold up the pot"
        )
        fixes.append("Make the banquet longer (or the machine slower) to see the stall chunking removes.")
    elif flat:
        best = min(flat, key=lambda r: r.banquet_ttft_s)
        headline = (
            f"The banquet stalled the pot: a {ms(cont.itl_max_s)} gap ({cont.spike:.1f}x the usual) under "
            f"continuous; chunked prefill with a budget of {best.token_budget} kept it to {best.spike:.1f}x, "
            f"for a banquet TTFT of {ms(best.banquet_ttft_s)} instead of {ms(cont.banquet_ttft_s)}"
        )
        fixes.append(
            f"Use chunked prefill with a token budget of {best.token_budget}: the least banquet TTFT among "
            "the budgets that kept every gap under 2x the usual one here."
        )
        fixes.append("A larger budget finishes the banquet sooner, a smaller one keeps the ladle steadier.")
    else:
        headline = (
            f"The banquet stalled the pot ({cont.spike:.1f}x the usual gap) and no budget tried kept the "
            f"worst gap under {STALL_SPIKE:g}x"
        )
        fixes.append("Try smaller token budgets: each step then carries a smaller piece of the banquet.")
    return Verdict(headline=headline, slow_phase="decode", decode_bound=None, fixes=fixes, evidence=evidence)


def diagnose_leftovers(
    cold_ttft_s: float, warm_ttft_s: float, cached_share: float, hit_rate: float, held_bytes: int
) -> Verdict:
    """Did reusing a cached prefix cut the wok's time as much as the share of the prompt it covered?"""
    ratio = warm_ttft_s / cold_ttft_s
    evidence = [
        f"an order with {cached_share:.0%} of its prompt cached: TTFT {ms(warm_ttft_s)} against "
        f"{ms(cold_ttft_s)} cold ({ratio:.2f}x; the goal is <= {LEFTOVERS_GOAL}x at 90 % cached)",
        f"on the stream of orders: {hit_rate:.0%} of prompt tokens looked up were found cached (vLLM's hit "
        f"rate); leftovers held {held_bytes / 1e6:.1f} MB of KV cache at the end",
    ]
    fixes = ["Put the shared part (system prompt, house rules) first and keep it token-identical: only an "
             "exact prefix is reused."]  # fmt: skip
    if ratio <= LEFTOVERS_GOAL:
        headline = (
            f"With {cached_share:.0%} of the order already cooked, the first dish came in {ratio:.2f}x the "
            "cold time: the wok only tossed the tail"
        )
    elif ratio < 1 / SERVING_GAIN:
        headline = (
            f"Reuse helped ({ratio:.2f}x the cold TTFT) but less than the {cached_share:.0%} cached suggests: "
            "the step's fixed costs and the tail's attention over the whole prefix remain"
        )
    else:
        headline = f"Reuse did not shorten the wait here ({ratio:.2f}x the cold TTFT)"
        fixes.append("Check the hit rate: a prefix that differs in its first tokens is never found.")
    fixes.append(
        "Leftovers are evicted oldest first when a seat or memory is needed: reuse costs no capacity."
    )
    return Verdict(headline=headline, slow_phase="prefill", decode_bound=None, fixes=fixes, evidence=evidence)


# -- serving verdicts: the apprentice chef, the two kitchens (lab/apprentice.py, lab/two_kitchens_lab.py) --

SPEC_PAYS = 1.05  # a draft "pays" when decode tokens/s rose by more than 5 % (repeat noise on this machine)


@dataclass(frozen=True)
class SpecNumbers:
    """One draft on one order, measured (lab/apprentice.py `SpecRow` carries these)."""

    draft: str  # "ngram" | "apprentice"
    order: str
    batch: int
    k: int
    speedup: float  # decode tokens/s with the draft / without
    acceptance_rate: float  # alpha
    mean_acceptance_length: float
    cost_ratio: float  # c: a draft pass / a plain decode step
    predicted_speedup: float


def diagnose_speculation(rows: list[SpecNumbers]) -> Verdict:
    """Where did drafting pay, and why not elsewhere: acceptance (alpha), the draft's cost (c), the batch."""
    evidence = [
        f"{r.draft} on the {r.order} order, batch {r.batch}: x{r.speedup:.2f} measured, x{r.predicted_speedup:.2f} "
        f"predicted; alpha {r.acceptance_rate:.2f}, {r.mean_acceptance_length:.2f} tokens per pass, c {r.cost_ratio:.2f}"
        for r in rows
    ]
    single = [r for r in rows if r.batch == 1]
    best = max(single or rows, key=lambda r: r.speedup)
    fixes = []
    if best.speedup >= SPEC_PAYS:
        headline = (
            f"The best draft was {best.draft} on the {best.order} order: x{best.speedup:.2f} decode speed, "
            f"{best.mean_acceptance_length:.2f} tokens per pass of the chef"
        )
    else:
        headline = f"No draft paid off here: the best was {best.draft} on the {best.order} order at x{best.speedup:.2f}"
    app = [r for r in single if r.draft == "apprentice"]
    if app and max(r.speedup for r in app) < SPEC_PAYS:
        weak = min(app, key=lambda r: r.speedup)
        fixes.append(
            f"The apprentice did not pay ({weak.order}: x{weak.speedup:.2f}): each round costs k x c + 1 = "
            f"{weak.k} x {weak.cost_ratio:.2f} + 1 = {weak.k * weak.cost_ratio + 1:.2f} chef steps and returns "
            f"{weak.mean_acceptance_length:.2f} tokens (alpha {weak.acceptance_rate:.2f}). It needs a higher "
            "alpha (a better-trained apprentice) or a lower c (a cheaper one), or a smaller k."
        )
    sampled = [r for r in single if "T=" in r.order and r.draft == "apprentice"]
    if sampled:
        fixes.append(
            f"Sampled, the greedy apprentice's guess is accepted only with the chef's probability of it: alpha "
            f"{sampled[0].acceptance_rate:.2f} here. Draft greedily only for greedy orders."
        )
    big = [r for r in rows if r.batch > 1]
    lost = [r for r in big if r.speedup < 1 / SPEC_PAYS]
    if lost:
        worst = min(lost, key=lambda r: r.speedup)
        fixes.append(
            f"Turn drafting off for big batches: at batch {worst.batch} {worst.draft} ran at x{worst.speedup:.2f}. "
            "Every table's check feeds k + 1 tokens into the pass, and a full pass no longer costs the same "
            "as a one-token one."
        )
    return Verdict(headline=headline, slow_phase="decode", decode_bound=None, fixes=fixes, evidence=evidence)


def diagnose_two_kitchens(worst_gap_one_s: float, worst_gap_two_s: float, usual_gap_one_s: float,
                          transfer_s: float, predicted_transfer_s: float, ttft_two_s: float) -> Verdict:  # fmt: skip
    """Did the second kitchen keep the pot steady, and what did carrying the K/V cost the first dish?"""
    ratio = transfer_s / predicted_transfer_s if predicted_transfer_s else float("inf")
    evidence = [
        f"one kitchen: worst decode gap {ms(worst_gap_one_s)} ({worst_gap_one_s / usual_gap_one_s:.1f}x its usual "
        f"{ms(usual_gap_one_s)}); two kitchens: worst {ms(worst_gap_two_s)}",
        f"the longest order's K/V crossed in {transfer_s * 1e3:.2f} ms, {ratio:.2f}x the link's prediction "
        f"({predicted_transfer_s * 1e3:.2f} ms): {transfer_s / ttft_two_s:.1%} of its TTFT {ms(ttft_two_s)}",
    ]
    fixes = []
    if worst_gap_two_s * SPEC_PAYS < worst_gap_one_s:
        headline = (
            f"The second kitchen kept the pot steady: its worst gap was {ms(worst_gap_two_s)} against "
            f"{ms(worst_gap_one_s)} when the wok shared the stove"
        )
    else:
        headline = "The second kitchen did not steady the pot here: the worst gaps were alike"
        fixes.append("Make the long orders longer, or bring them closer together, to see the stall it removes.")
    if not 0.5 <= ratio <= 2:
        fixes.append(f"The transfer was {ratio:.2f}x the link's latency + bytes / bandwidth: the machine was busy, "
                     "or the link's fit does not hold at this size; rerun before trusting the what-if.")  # fmt: skip
    fixes.append("The what-if chart computes what the same bytes would take over a link of another bandwidth "
                 "(computed, not measured).")  # fmt: skip
    return Verdict(headline=headline, slow_phase="decode", decode_bound=None, fixes=fixes, evidence=evidence)
