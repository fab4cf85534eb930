"""The inspector's verdicts on the serving lab: whole streams of orders, not one order's trace.

lab/inspector.py diagnoses one order from its trace (which pot was slower, and why). The serving
experiments measure streams -- the dinner rush, the stalled pot, the leftovers, the apprentice
chef, the two kitchens -- and each verdict here reads the few numbers those measure (the tests
build them by hand) and says what they show, with the threshold it used.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.inspector import Verdict, ms

SERVING_GAIN = 1.2  # one policy "serves more" when it reaches >= 1.2x the other's requests/s
STALL_SPIKE = 2.0  # the pot "stalls" when a gap between tokens is >= 2x the usual (median) gap
LEFTOVERS_GOAL = 0.3  # the goal: an order with 90 % of its prompt cached: TTFT <= 0.3x cold


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
                "(the typical time per token): seat fewer tables at once where the rhythm of the words matters more "
                "than guests per second."
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
            f"The apprentice did not pay ({weak.order}: x{weak.speedup:.2f}): each round costs one chef step plus "
            f"{weak.k} guesses at {weak.cost_ratio:.2f} of a step each = {weak.k * weak.cost_ratio + 1:.2f} chef steps and returns "
            f"{weak.mean_acceptance_length:.2f} tokens (the chef kept {weak.acceptance_rate:.0%} of its guesses). "
            "It needs guesses the chef keeps more often (a better-trained apprentice), a cheaper apprentice, "
            "or fewer guesses per round."
        )
    sampled = [r for r in single if "T=" in r.order and r.draft == "apprentice"]
    if sampled:
        fixes.append(
            f"Sampled, the apprentice's likeliest guess is kept only as often as the chef would pick it: "
            f"{sampled[0].acceptance_rate:.0%} here. Let the apprentice guess only for orders that take the "
            "likeliest word."
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
