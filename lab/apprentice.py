"""Experiment: the apprentice chef -- speculative decoding, measured on the real serving path.

Kitchen words: the chef ladles one spoonful per trip to the pot. An apprentice guesses the next
few spoonfuls; the chef tastes all the guesses in one trip and keeps those he agrees with, plus
one of his own. Good guesses: several spoonfuls per trip. Bad guesses: the apprentice's time and
a heavier trip, for one spoonful. Copying a dish already on the pass (prompt lookup) costs the
apprentice nothing at all, but only works when the order repeats what is on the ticket.

Engine words: a draft proposes k tokens; the target scores all k + 1 positions in one forward
pass and keeps the agreed prefix plus one token (engine/speculative.py, engine/draft.py). Drafts:
`ngram` (prompt lookup) and `apprentice` (the small model with the chef's tokenizer). Greedy, so
the text must be token-identical to plain decoding; the table says whether it was.

Measured per order (`orders`: "copy", whose prompt already holds the text to come; "fresh", an
open prompt; the fresh one sampled), served alone, plain and each draft interleaved, median of
repeats:
  decode tok/s     decode tokens / (E2E - TTFT), all tables of the order together; speedup is
                   the median of each repeat's drafted / plain pair (run back to back, so a
                   neighbour's burst on a shared machine moves one pair, not the answer)
  acceptance       alpha = accepted / (accepted + rejected): per draft token, given it was reached
  accepted at i    share of rounds whose draft token i was accepted
  passes/token     target forward passes per decode token
  c                the apprentice's seconds per draft pass / the chef's plain decode step
  v                a verification pass (k + 1 tokens) / a plain decode step (1 token)
  predicted        Leviathan et al. 2023: tokens per pass (1 - a^(k+1)) / (1 - a), speedup =
                   that / (k c + 1); prompt lookup has no draft model: c = 0. The formula
                   assumes v = 1 and drafts of full length k; the table shows how far that holds.
Then the copy order at larger batches: each table's check feeds k + 1 tokens per pass, so the
pass grows k + 1 times faster than plain decode's -- the slowdown at large batch is shown.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from statistics import median

import pandas as pd
import plotly.graph_objects as go

from engine.errors import EngineError
from engine.events import Done, StepEnd
from engine.speculative import MAX_SPECULATE, SpecCounters
from lab.experiment import Experiment, Prediction, StoryLink
from lab.noise import MIN_REPEATS, SPREAD_LEGEND, Machine, MachineWatch, Spread, error_bars, spread_of
from lab.plot_kit import POT, WOK, finish, guess_marker, labels_below_too, reference_line
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.serving_verdicts import SpecNumbers, diagnose_speculation

FRESH_TEXT = "KING RICHARD II:\nNow is the hour to speak of kings and crowns;\nWhat say you, cousin?\n"
DRAFTS = ("ngram", "apprentice")
SAMPLED_T = 0.8  # the sampled order's temperature
COPY_LEAD = 64  # tokens of the chef's own answer that the copy order's prompt already holds


@dataclass(frozen=True)
class ApprenticeSettings:
    k: int = 4  # draft tokens per round
    new_tokens: int = 64
    batches: tuple[int, ...] = (1, 8)  # the copy order at these batch sizes (1 is always measured)
    repeats: int = 3
    drafts: tuple[str, ...] = DRAFTS


@dataclass(frozen=True)
class SpecRow:
    order: str  # "copy" | "fresh"
    draft: str  # "ngram" | "apprentice"
    batch: int
    plain_tps: float  # decode tokens/s without a draft, same order and batch
    spec_tps: float
    speedup: float  # median over repeats of spec / plain, each pair run back to back
    identical: bool | None  # greedy: every repeat's tokens equal plain decoding's (None: sampled)
    drafts: int  # verification rounds (summed over tables, last repeat)
    drafted: int
    accepted: int
    acceptance_rate: float  # alpha
    mean_acceptance_length: float  # 1 + accepted / drafts
    passes_per_token: float  # target passes per decode token (plain: 1)
    cost_ratio: float  # c: draft pass seconds / plain decode step seconds (0 for prompt lookup)
    verify_ratio: float  # v: verification pass seconds / plain decode step seconds
    predicted_speedup: float  # Leviathan: (1 - a^(k+1)) / (1 - a) / (k c + 1)
    accepted_at: tuple[float, ...]  # share of rounds accepted at draft position 1..k
    speedup_spread: Spread | None = None  # the repeats' speedups: median and range


@dataclass(frozen=True)
class ApprenticeResult:
    settings: ApprenticeSettings
    model: str
    device: str
    rows: list[SpecRow]
    notes: list[str] = field(default_factory=list)
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(r) | {"accepted_at": " ".join(f"{a:.2f}" for a in r.accepted_at)}
                             for r in self.rows])  # fmt: skip

    def positions_frame(self) -> pd.DataFrame:
        """Long form: one row per (order, draft, batch, draft position)."""
        return pd.DataFrame([{"order": r.order, "draft": r.draft, "batch": r.batch, "position": i + 1, "accepted": a}
                             for r in self.rows for i, a in enumerate(r.accepted_at)])  # fmt: skip

    def row(self, order: str, draft: str, batch: int = 1) -> SpecRow | None:
        return next((r for r in self.rows if (r.order, r.draft, r.batch) == (order, draft, batch)), None)


def tokens_per_pass(alpha: float, k: int) -> float:
    """Leviathan et al.'s expected tokens per verification pass for i.i.d. acceptance alpha."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    return tokens_per_pass(alpha, k) / (k * c + 1)


@dataclass(frozen=True)
class ServedOrder:
    """One order served: its tokens and what it cost."""

    tokens: list[list[int]]
    decode_tps: float
    decode_passes: int
    pass_s: float  # median seconds of the target's decode passes
    counters: SpecCounters
    draft_pass_s: float  # the draft model's seconds per pass (0: no draft model)


def serve(engine, prompt: list[int], batch: int, new: int, k: int = 0, draft: str = "ngram",
          temperature: float = 0.0) -> ServedOrder:  # fmt: skip
    """`batch` copies of one order submitted together, each `new` tokens (seeded when sampled);
    plain decoding when k = 0."""
    spec = {"speculate": k, "draft": draft} if k else {}
    ids = [engine.submit(prompt, new, stop_at_eos=False, temperature=temperature, seed=i, **spec)
           for i in range(batch)]  # fmt: skip
    model = engine.serving.drafter.models.get(draft) if k else None
    before = (model.cost.seconds, model.cost.passes) if model else (0.0, 0)
    results, passes = {}, []
    while not engine.idle:
        for ev in engine.step():
            if isinstance(ev, StepEnd) and ev.decode_tokens and not ev.prefill_tokens:
                passes.append(ev.step.seconds)
            elif isinstance(ev, Done):
                results[ev.request_id] = ev.result
    res = [results[i] for i in ids]
    window = max(r.metrics.e2e_s for r in res) - max(r.metrics.ttft_s for r in res)
    total = SpecCounters(accepted_at=[0] * k)  # every table's counters together
    for c in (r.speculation for r in res if r.speculation is not None):
        total.add(c)
    d_s, d_n = (model.cost.seconds - before[0], model.cost.passes - before[1]) if model else (0.0, 0)
    decode_tokens = sum(len(r.tokens) - 1 for r in res)
    return ServedOrder([r.tokens for r in res], decode_tokens / window if window > 0 else 0.0, len(passes),
                  median(passes) if passes else 0.0, total, d_s / d_n if d_n else 0.0)  # fmt: skip


def check_settings(engine, s: ApprenticeSettings) -> None:
    if not 1 <= s.k <= MAX_SPECULATE:
        raise EngineError(f"the apprentice chef: k must be 1..{MAX_SPECULATE} draft tokens (got {s.k})")
    if s.new_tokens < 8:
        raise EngineError(f"the apprentice chef: new_tokens must be at least 8 (got {s.new_tokens})")
    if not s.batches or min(s.batches) < 1 or max(s.batches) > 64:
        raise EngineError(f"the apprentice chef: batch sizes must be 1..64 (got {list(s.batches)})")
    if not s.drafts or any(d not in DRAFTS for d in s.drafts):
        raise EngineError(
            f"the apprentice chef: drafts must be among {', '.join(DRAFTS)} (got {list(s.drafts)})"
        )


def orders(engine) -> dict[str, tuple[list[int], float]]:
    """Order name -> (prompt, temperature).

    fresh          an open prompt: nothing in it to copy (a greedy small model may still repeat
                   its own new text, which prompt lookup then finds)
    copy           the fresh prompt followed by the chef's own greedy answer to it (COPY_LEAD
                   tokens): what it writes next is mostly already on the ticket. (The chef is too
                   small to copy a quote back from its prompt; it does repeat its own phrases.)
    fresh, T=0.8   the fresh order sampled: text that rarely repeats, and tokens the greedy
                   apprentice often misses
    """
    if engine.codec is not None:
        fresh = engine.encode(FRESH_TEXT)
    else:
        fresh = [random.Random(0).randrange(engine.cfg.vocab_size) for _ in range(24)]
    lead = serve(engine, fresh, 1, COPY_LEAD).tokens[0]
    return {"copy": (fresh + lead, 0.0), "fresh": (fresh, 0.0), f"fresh, T={SAMPLED_T:g}": (fresh, SAMPLED_T)}


def measure(engine, order: str, prompt: list[int], temperature: float, batch: int, drafts: list[str],
            s: ApprenticeSettings) -> list[SpecRow]:  # fmt: skip
    """Plain and each draft interleaved `repeats` times; medians of decode tok/s. `identical` is
    None when sampled: a seeded speculating run draws its random numbers differently."""
    k = s.k
    serve(engine, prompt, batch, 4, temperature=temperature)  # warm-up: each path once
    for d in drafts:
        serve(engine, prompt, batch, 4, k, d, temperature)
    plain_tps, plain_step, tps, runs = [], [], {d: [] for d in drafts}, {}
    same = dict.fromkeys(drafts, True if temperature == 0 else None)
    for _ in range(max(MIN_REPEATS, s.repeats)):
        plain = serve(engine, prompt, batch, s.new_tokens, temperature=temperature)
        plain_tps.append(plain.decode_tps)
        plain_step.append(plain.pass_s)
        for d in drafts:
            runs[d] = serve(engine, prompt, batch, s.new_tokens, k, d, temperature)
            tps[d].append(runs[d].decode_tps)
            if same[d] is not None:
                same[d] = same[d] and runs[d].tokens == plain.tokens
    step, base = median_of(plain_step), median_of(plain_tps)
    rows = []
    for d in drafts:
        r, c = runs[d], runs[d].counters
        cost = r.draft_pass_s / step if step else 0.0
        rows.append(SpecRow(
            order=order, draft=d, batch=batch, plain_tps=base, spec_tps=median_of(tps[d]),
            speedup=median_of([b / a for a, b in zip(plain_tps, tps[d], strict=True)]), identical=same[d],
            speedup_spread=spread_of([b / a for a, b in zip(plain_tps, tps[d], strict=True)]),
            drafts=c.drafts, drafted=c.drafted, accepted=c.accepted, acceptance_rate=c.acceptance_rate,
            mean_acceptance_length=c.mean_acceptance_length,
            passes_per_token=r.decode_passes / (s.new_tokens - 1),  # each table gets one token per pass, or more
            cost_ratio=cost, verify_ratio=r.pass_s / step if step else 0.0,
            predicted_speedup=predicted_speedup(c.acceptance_rate, k, cost),
            accepted_at=tuple(a / c.drafts if c.drafts else 0.0 for a in c.accepted_at),
        ))  # fmt: skip
    return rows


def run_apprentice(
    engine, settings: ApprenticeSettings, on_progress: ProgressFn | None = None
) -> ApprenticeResult:
    """Speedup, acceptance and the formula's prediction for each draft, then the copy order at larger batches."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    check_settings(engine, settings)
    prompts, notes, drafts = orders(engine), [], list(settings.drafts)
    if "apprentice" in drafts:
        try:
            engine.submit(
                prompts["fresh"][0], 2, speculate=1, draft="apprentice"
            )  # loads it once, or refuses
            while not engine.idle:
                engine.step()
        except EngineError as err:
            drafts.remove("apprentice")
            notes.append(f"no apprentice for this model: {err}")
    big = sorted(b for b in set(settings.batches) if b > 1)
    tracker = ProgressTracker([1.0] * len(prompts) + [b / 2 for b in big], on_progress)
    rows = []
    for name, (prompt, temperature) in prompts.items():
        rows += measure(engine, name, prompt, temperature, 1, drafts, settings)
        tracker.step(f"{name} order, one table")
    for b in big:
        rows += measure(engine, "copy", prompts["copy"][0], 0.0, b, drafts, settings)
        tracker.step(f"copy order, {b} tables")
    if any(r.identical is False for r in rows):
        notes.append("speculation changed the greedy text of: "
                     + ", ".join(f"{r.draft} {r.order} x{r.batch}" for r in rows if r.identical is False))  # fmt: skip
    for r in rows:
        same = {True: ", identical text", False: ", TEXT CHANGED", None: ""}[r.identical]
        notes.append(f"{r.draft} on the {r.order} order, {r.batch} table(s): x{r.speedup:.2f} the plain speed{same}; "
                     f"the chef kept {r.acceptance_rate:.0%} of the guesses, {r.mean_acceptance_length:.2f} tokens per "
                     f"check; the textbook formula expected x{r.predicted_speedup:.2f}")  # fmt: skip
    notes.append(f"the helper guesses {settings.k} tokens ahead each round, {settings.new_tokens} new tokens per "
                 f"table, always the likeliest word except the order sampled at temperature {SAMPLED_T:g}; "
                 "copying from the ticket (prompt lookup) costs nothing to guess")  # fmt: skip
    return watch.stamp(ApprenticeResult(settings, engine.info.name, str(engine.info.device), rows, notes))


# -- figures --------------------------------------------------------------------------------------

COLOURS = {"ngram": WOK, "apprentice": POT}


def speedup_figure(result: ApprenticeResult, guess: float | None = None) -> go.Figure:
    """Measured speedup per order and draft at one table, the formula's prediction beside it."""
    fig = go.Figure()
    one = [r for r in result.rows if r.batch == 1]
    for d in dict.fromkeys(r.draft for r in one):
        rows = [r for r in one if r.draft == d]
        spreads = [r.speedup_spread for r in rows]
        fig.add_trace(go.Bar(x=[r.order for r in rows], y=[r.speedup for r in rows],
                             name=f"{d}: measured, median ({SPREAD_LEGEND})", marker_color=COLOURS[d],
                             text=[f"x{r.speedup:.2f}" for r in rows], textposition="inside", insidetextanchor="start", offsetgroup=d,
                             error_y=error_bars(spreads) if all(spreads) else None))  # fmt: skip
        fig.add_trace(go.Scatter(x=[r.order for r in rows], y=[r.predicted_speedup for r in rows], mode="markers",
                                 name=f"{d}: the textbook formula's prediction", offsetgroup=d,
                                 marker=dict(symbol="diamond-open", size=13, color=COLOURS[d], line=dict(width=2))))  # fmt: skip
    reference_line(fig, 1, "plain decoding (x1)")
    if guess is not None:
        fig.add_trace(guess_marker("fresh", guess, f"your guess: x{guess:g}"))
    fig.update_layout(barmode="group", scattermode="group")
    fig.update_yaxes(title="decode tokens/s, x plain decoding", rangemode="tozero")
    fig.update_xaxes(title="the order (one table)")
    return finish(fig, f"The apprentice chef: speedup per helper, guessing {result.settings.k} tokens ahead ({result.device})")


def acceptance_figure(result: ApprenticeResult) -> go.Figure:
    """How often the chef agreed with draft token i: the drop with i is why a long draft stops paying."""
    fig = go.Figure()
    dashes = {"copy": None, "fresh": "dash"}
    for r in (r for r in result.rows if r.batch == 1):
        fig.add_trace(go.Scatter(x=list(range(1, len(r.accepted_at) + 1)), y=list(r.accepted_at),
                                 mode="lines+markers", name=f"{r.draft}, {r.order}",
                                 line=dict(color=COLOURS[r.draft], dash=dashes.get(r.order, "dot"))))  # fmt: skip
    fig.update_xaxes(title="draft position", dtick=1)
    fig.update_yaxes(title="share of rounds accepted at this position", range=[0, 1.05])
    return finish(fig, "How often the chef kept the apprentice's guess, by its place in the round (one table)")


def batch_figure(result: ApprenticeResult) -> go.Figure:
    """The copy order at growing batch: the slowdown at large batch, shown."""
    fig = go.Figure()
    copy = [r for r in result.rows if r.order == "copy"]
    top = max((r.speedup for r in copy), default=1.0)
    for d in dict.fromkeys(r.draft for r in copy):
        rows = sorted((r for r in copy if r.draft == d), key=lambda r: r.batch)
        fig.add_trace(go.Scatter(x=[r.batch for r in rows], y=[r.speedup for r in rows], mode="lines+markers+text",
                                 name=d, line=dict(color=COLOURS[d]), text=[f"x{r.speedup:.2f}" for r in rows],
                                 textposition=[_label_side(r, copy) for r in rows]))  # fmt: skip
    reference_line(fig, 1, "plain decoding (x1)")
    batches = sorted({r.batch for r in copy})
    fig.update_xaxes(title="tables (batch)", type="log", tickvals=batches, ticktext=[str(b) for b in batches])
    fig.update_yaxes(title="decode tokens/s, x plain decoding")
    labels_below_too(fig, max(1.0, top) * 1.3)  # room above the highest label, and under the lowest
    return finish(fig, "The copy order at larger batches: each check feeds k + 1 tokens per table")


def _label_side(row: SpecRow, rows: list[SpecRow]) -> str:
    """Where a point's value label goes: the highest point of its batch labels above it, the other
    below it, so two helpers measuring close speedups (x1.32 and x1.24, or x0.58 and x0.53 near
    the axis) print apart: the two labels sit on either side of the two points."""
    return "top center" if row.speedup >= max(r.speedup for r in rows if r.batch == row.batch) else "bottom center"


# -- the experiment -------------------------------------------------------------------------------


def apprentice_verdict(result: ApprenticeResult, roof=None, dtype: str | None = None):
    k = result.settings.k
    return diagnose_speculation([SpecNumbers(r.draft, r.order, r.batch, k, r.speedup, r.acceptance_rate,
                                             r.mean_acceptance_length, r.cost_ratio, r.predicted_speedup)
                                 for r in result.rows])  # fmt: skip


def guess_answer(result: ApprenticeResult) -> float:
    """The apprentice's speedup on the fresh order (prompt lookup's where this model has no apprentice)."""
    row = result.row("fresh", "apprentice") or result.row("fresh", "ngram")
    return row.speedup


def settings_form(ui, info) -> ApprenticeSettings:
    k = ui.slider("Draft tokens per round (k)", 1, 8, 4, key="apprentice-k")
    new = ui.slider("New tokens per table", 16, 128, 64, key="apprentice-new")
    big = ui.select_slider("Larger batch for the copy order", options=[2, 4, 8, 16], value=8, key="apprentice-batch")
    repeats = ui.slider("Repeats (the median is drawn, with the range as a bar)", 3, 7, 3, key="apprentice-repeats")
    return ApprenticeSettings(k=k, new_tokens=new, batches=(1, big), repeats=repeats)


EXPERIMENT = Experiment(
    key="apprentice",
    title="The apprentice chef: speculative decoding",
    nav_title="The apprentice chef: speculative decoding",
    icon=":material/person_apron:",
    kitchen="The chef ladles one spoonful per trip to the pot. An apprentice guesses the next few; the chef "
    "tastes all the guesses in one trip and keeps those he agrees with, plus one of his own. Copying a dish "
    "already on the pass (prompt lookup) costs the apprentice nothing, but only helps when the order repeats "
    "what is on the ticket.",
    engineering="A draft proposes k tokens; the target scores all k + 1 positions in one forward pass and keeps "
    "the agreed prefix plus one token (Leviathan et al. 2023), so greedy output is token-identical. Drafts: "
    "prompt lookup (n-gram) and the apprentice, a small model with the chef's tokenizer decoding from its own "
    "KV cache. Expected tokens per pass (1 - a^(k+1)) / (1 - a) for acceptance a; speedup = that / (k c + 1), "
    "with c = a draft step's cost over a target step's. We measure a and c and compare.",
    predict=Prediction(
        question="The apprentice drafts k tokens a round for the chef (k as set above), on an order that copies nothing "
        "(greedy, one table). Decode speed: how many times plain decoding?",
        unit="x",
        min_value=0.1,
        max_value=8.0,
        step=0.05,
        answer=guess_answer,
    ),
    form=settings_form,
    run=run_apprentice,
    figures=lambda r, g: [speedup_figure(r, g), acceptance_figure(r), batch_figure(r)],
    record=lambda info: ApprenticeSettings(repeats=5),
    story=StoryLink(
        ":material/person_apron: The apprentice prepares ladles ahead",
        "**Speculative decoding**: a cheap draft (a small model, or n-gram lookup in the prompt) proposes "
        "tokens; the large model verifies them all in one pass and keeps the agreed ones, exactly as if it "
        "had decoded them itself.",
        "Lab: the apprentice chef (speculative decoding)",
    ),
    tables=lambda r: {"drafts": r.to_frame(), "positions": r.positions_frame()},
    verdict=apprentice_verdict,
    verdict_on=lambda r: f"k = {r.settings.k}, {r.settings.new_tokens} tokens per table, batch 1 and "
    f"{max(r.settings.batches)}",
)
