"""Experiment 9, don't stall the pot: a long order arriving while tables are mid-soup, whole or in chunks.

Kitchen words: four tables are being ladled their soup when a banquet ticket arrives. If the cook
turns to the wok and tosses the whole banquet before the next ladle, every table sees a long pause
between two spoonfuls. If the banquet goes into the wok a handful at a time, between ladles, the
ladling rhythm barely changes; the banquet's first dish comes a little later.

Engine words: under `continuous` a step is prefill-only or decode-only and prefill goes first, so
the banquet's whole prompt is one pass and every running decode waits for it: one inter-token gap
(ITL) spikes. Under `chunked` (Sarathi-Serve, vLLM V1) every step has a token budget: each running
decode gets its token first, and prefill chunks fill what is left, in one pass. A smaller budget
means smaller chunks: flatter ITL, but more steps before the banquet's first token (TTFT).

Measured: `tables` orders decoding (exact lengths, EOS ignored); once each has `join_after` tokens
the banquet is submitted; the engine runs until all finish. The tables' gaps between tokens come
from the engine's own per-request ITL (vLLM's definition), median over the tables at each token;
the banquet's TTFT is its own. Once under `continuous` (the whole banquet in one pass) and under
`chunked` for each token budget, `repeats` times each; the summary numbers are medians over repeats.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from engine.errors import EngineError
from engine.events import Done, StepEnd, Token
from lab.experiment import Experiment, Prediction, StoryLink
from lab.noise import MIN_REPEATS, SPREAD_LEGEND, Machine, MachineWatch, Spread, error_bars, spread_of
from lab.plot_kit import POT, WOK, finish, guess_marker, mark_x, reference_line
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.serve_replay import serving_engine, warm_up
from lab.serving_verdicts import StallNumbers, diagnose_stall
from lab.workload import prompt_ids


@dataclass(frozen=True)
class StallSettings:
    tables: int = 4  # orders decoding when the banquet arrives
    table_prompt: int = 16
    table_answer: int = 40  # tokens each table is served
    join_after: int = 10  # tokens each table has when the banquet arrives
    banquet_prompt: int = 384
    banquet_answer: int = 4
    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)  # chunked prefill's tokens per step
    repeats: int = 3


@dataclass(frozen=True)
class StallRun:
    policy: str  # "continuous" or "chunked"
    token_budget: int
    banquet_ttft_s: float  # median over repeats
    itl_p50_s: float  # the tables' usual gap (median over repeats)
    itl_max_s: float  # their worst gap (median over repeats of each repeat's worst)
    itl_s: list[float]  # the last repeat's gaps, gap i = between the tables' tokens i+1 and i+2
    # The scheduler's decisions, the same on any machine at any load (they carry the lesson in counts):
    banquet_passes: int  # passes from the banquet's arrival to its first token (1 when it goes whole)
    stall_tokens: int  # the most tokens the stove computed between two of the tables' tokens
    ttft: Spread | None = None  # seconds: the banquet's TTFT over the repeats (median, range)
    worst: Spread | None = None  # seconds: each repeat's worst gap (median, range)

    @property
    def label(self) -> str:
        return (
            "continuous (whole banquet)"
            if self.policy == "continuous"
            else f"chunked, budget {self.token_budget}"
        )

    def numbers(self) -> StallNumbers:
        return StallNumbers(
            self.policy, self.token_budget, self.banquet_ttft_s, self.itl_p50_s, self.itl_max_s
        )


@dataclass(frozen=True)
class StallResult:
    settings: StallSettings
    runs: list[StallRun]
    notes: list[str]
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    @property
    def continuous(self) -> StallRun:
        return self.runs[0]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            [{"policy": r.policy, "token_budget": r.token_budget, "banquet_ttft_s": r.banquet_ttft_s,
              "itl_p50_s": r.itl_p50_s, "itl_max_s": r.itl_max_s, "spike": r.itl_max_s / r.itl_p50_s,
              "banquet_passes": r.banquet_passes, "stall_tokens": r.stall_tokens}
             for r in self.runs]
        )  # fmt: skip

    def gaps_frame(self) -> pd.DataFrame:
        """Every measured gap of the last repeat, per run: the ITL timeline's data."""
        return pd.DataFrame(
            [{"run": r.label, "token": i + 2, "itl_ms": g * 1e3} for r in self.runs for i, g in enumerate(r.itl_s)]
        )  # fmt: skip


def check(engine, s: StallSettings) -> None:
    """Refuse settings this lesson cannot run, in one line naming the limit."""
    ctx = engine.info.max_context
    if not 1 <= s.tables <= 32:
        raise EngineError(f"don't stall the pot: tables must be between 1 and 32 (got {s.tables})")
    if not 1 <= s.join_after <= s.table_answer - 4:
        raise EngineError(
            f"don't stall the pot: the banquet must arrive after 1 to {s.table_answer - 4} of the tables' "
            f"{s.table_answer} tokens, so some are left to watch (got {s.join_after})"
        )
    for what, total in (
        ("a table", s.table_prompt + s.table_answer),
        ("the banquet", s.banquet_prompt + s.banquet_answer),
    ):
        if total > ctx:
            raise EngineError(
                f"don't stall the pot: {what} needs {total} tokens; the model's context is {ctx}"
            )
    if not s.budgets or min(s.budgets) <= s.tables:
        raise EngineError(
            f"don't stall the pot: each token budget must exceed the {s.tables} decoding tables "
            "(they get their tokens first)"
        )
    if s.repeats < 1 or s.banquet_prompt < 1 or s.table_prompt < 1 or s.banquet_answer < 1:
        raise EngineError("don't stall the pot: repeats and every length must be at least 1")


@dataclass(frozen=True)
class ServedOnce:
    """One run's numbers: two measured on the clock, two counted from the scheduler's passes."""

    banquet_ttft_s: float
    gaps: list[float]  # the tables' gaps between tokens (median over the tables at each gap), seconds
    banquet_passes: int  # passes from the banquet's submission to its first token, that pass included
    stall_tokens: int  # the most tokens (prefill + decode) computed between two of the tables' tokens


def serve_once(base, s: StallSettings, policy: str, budget: int) -> ServedOnce:
    """One run: tables decoding, the banquet arrives; its TTFT, the tables' gaps, and the passes behind them.

    The counts say what the clock shows, on any machine: under `continuous` the banquet's whole
    prompt is one pass that the tables wait through (`stall_tokens` >= the prompt, `banquet_passes`
    1); chunked, every pass holds at most the budget (`stall_tokens` <= budget) and the banquet's
    prompt takes at least prompt / budget passes.
    """
    seat = max(s.table_prompt + s.table_answer, s.banquet_prompt + s.banquet_answer)
    eng = serving_engine(base, policy, token_budget=budget, max_seqs=s.tables + 1, max_seq_len=seat)
    warm_up(eng, base.info.vocab_size)
    tables = [eng.submit(prompt_ids(base, s.table_prompt, 7 * i), s.table_answer, stop_at_eos=False)
              for i in range(s.tables)]  # fmt: skip
    served = dict.fromkeys(tables, 0)
    done = {}
    banquet = None
    passes = arrived_at = 0  # passes run; the pass after which the banquet was submitted
    first_at = None  # the pass that gave the banquet its first token
    since_tables = stall_tokens = 0  # tokens computed since the tables' last token; the most of those
    while not eng.idle:
        events = eng.step()
        passes += 1
        since_tables += sum(ev.prefill_tokens + ev.decode_tokens for ev in events if isinstance(ev, StepEnd))
        for ev in events:
            if isinstance(ev, Token) and ev.request_id in served:
                served[ev.request_id] += 1
                stall_tokens, since_tables = max(stall_tokens, since_tables), 0
            elif isinstance(ev, Token) and ev.request_id == banquet and first_at is None:
                first_at = passes
            elif isinstance(ev, Done):
                done[ev.request_id] = ev.result.metrics
        if banquet is None and min(served.values()) >= s.join_after:
            banquet = eng.submit(prompt_ids(base, s.banquet_prompt, 3), s.banquet_answer, stop_at_eos=False)
            arrived_at = passes
    # (tables, gaps) -> (gaps, tables): at each gap, the median over the tables (they step together)
    gaps = [statistics.median(g) for g in zip(*(done[t].itl_s for t in tables), strict=True)]
    return ServedOnce(done[banquet].ttft_s, gaps, first_at - arrived_at, stall_tokens)


def run_stall(engine, settings: StallSettings, on_progress: ProgressFn | None = None) -> StallResult:
    """The banquet under continuous (one pass), then under chunked prefill for each token budget."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    s = settings
    check(engine, s)
    plan = [("continuous", s.banquet_prompt + s.tables)] + [("chunked", b) for b in sorted(set(s.budgets))]
    tracker = ProgressTracker([1.0] * len(plan) * max(MIN_REPEATS, s.repeats), on_progress)
    runs = []
    for policy, budget in plan:
        ttfts, p50s, maxes = [], [], []
        for _ in range(max(MIN_REPEATS, s.repeats)):
            once = serve_once(engine, s, policy, budget)
            ttfts.append(once.banquet_ttft_s), p50s.append(median_of(once.gaps)), maxes.append(max(once.gaps))
            tracker.step(
                f"{policy} {budget}: banquet TTFT {once.banquet_ttft_s * 1e3:.0f} ms, "
                f"worst gap {max(once.gaps) * 1e3:.0f} ms"
            )
        runs.append(StallRun(policy, budget, median_of(ttfts), median_of(p50s), median_of(maxes), once.gaps,
                             once.banquet_passes, once.stall_tokens, spread_of(ttfts), spread_of(maxes)))
    cont = runs[0]
    flattest = min(runs[1:], key=lambda r: r.itl_max_s / r.itl_p50_s)
    notes = [
        f"under continuous the tables' worst gap was {cont.itl_max_s * 1e3:.1f} ms, "
        f"{cont.itl_max_s / cont.itl_p50_s:.1f}x their usual {cont.itl_p50_s * 1e3:.1f} ms; "
        f"the banquet's TTFT {cont.banquet_ttft_s * 1e3:.0f} ms",
        f"chunked with a budget of {flattest.token_budget}: worst gap {flattest.itl_max_s / flattest.itl_p50_s:.1f}x "
        f"the usual, banquet TTFT {flattest.banquet_ttft_s * 1e3:.0f} ms",
    ]
    return watch.stamp(StallResult(s, runs, notes))


# -- figures --------------------------------------------------------------------------------------


def stall_figures(result: StallResult, guess: float | None = None) -> list[go.Figure]:
    gaps = result.gaps_frame()
    shades = ["#0b6e6e", POT, "#5cc8c8", "#a3e0e0", "#d0f0f0"]
    timeline = go.Figure()
    for i, run in enumerate(result.runs):
        part = gaps[gaps.run == run.label]
        colour = WOK if run.policy == "continuous" else shades[(i - 1) % len(shades)]
        timeline.add_trace(go.Scatter(x=part.token, y=part.itl_ms, mode="lines+markers", name=run.label,
                                      line=dict(color=colour), marker=dict(size=4)))  # fmt: skip
    arrival = result.settings.join_after + 1
    mark_x(timeline, arrival, "the banquet arrives", log_x=False)
    if guess is not None:
        timeline.add_trace(
            guess_marker(arrival, result.continuous.itl_p50_s * 1e3 * guess, f"your guess: {guess:g}x")
        )
    timeline.update_xaxes(title="the tables' token number")
    timeline.update_yaxes(title="gap before this token (ITL, ms)", type="log")
    finish(timeline, "Don't stall the pot: the tables' gaps between tokens as the banquet arrives")

    df = result.to_frame()
    trade = go.Figure()
    def bars(runs, which):  # each point's range over the repeats, when it was kept
        spreads = [getattr(r, which) for r in runs]
        return error_bars(spreads, 1e3) if all(spreads) else None

    # Each point is named in the legend, not labelled on the plot: the points land where the
    # measurement puts them, and a budget near the whole banquet's size lands beside continuous's,
    # where two labels drawn on the plot would cover each other.
    chunks = [r for r in result.runs if r.policy == "chunked"]
    conts = [r for r in result.runs if r.policy == "continuous"]
    trade.add_trace(go.Scatter(x=[r.banquet_ttft_s * 1e3 for r in chunks], y=[r.itl_max_s * 1e3 for r in chunks], mode="lines",
                               name=f"chunked, median ({SPREAD_LEGEND})", line=dict(color=POT)))  # fmt: skip
    for i, run in enumerate(chunks):
        trade.add_trace(go.Scatter(
            x=[run.banquet_ttft_s * 1e3], y=[run.itl_max_s * 1e3], mode="markers", name=f"chunked, budget {run.token_budget}",
            marker=dict(color=POT, size=11, symbol=BUDGET_SYMBOLS[i % len(BUDGET_SYMBOLS)]),
            error_x=bars([run], "ttft"), error_y=bars([run], "worst"),
        ))  # fmt: skip
    trade.add_trace(go.Scatter(x=[r.banquet_ttft_s * 1e3 for r in conts], y=[r.itl_max_s * 1e3 for r in conts], mode="markers",
                               name="continuous (whole banquet)", marker=dict(color=WOK, size=12),
                               error_x=bars(conts, "ttft"), error_y=bars(conts, "worst")))  # fmt: skip
    usual = df.itl_p50_s.median() * 1e3
    reference_line(trade, usual, f"the usual gap, {usual:.1f} ms")
    trade.update_xaxes(title="the banquet's TTFT (ms)", range=[0, df.banquet_ttft_s.max() * 1e3 * 1.2])
    trade.update_yaxes(title="the tables' worst gap (ms)", rangemode="tozero")
    return [
        timeline,
        finish(trade, "The trade-off, measured: the banquet's first dish vs the tables' worst gap"),
    ]


BUDGET_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross")  # a chunked point per budget, told apart


# -- the experiment -------------------------------------------------------------------------------


def stall_verdict(result: StallResult, roof=None, dtype: str | None = None):
    return diagnose_stall([r.numbers() for r in result.runs])


def settings_form(ui, info) -> StallSettings:
    tables = ui.slider("Tables decoding", 1, 16, 4, key="stall-tables")
    most = max(32, info.max_context - 8)
    banquet = ui.slider("Banquet prompt (tokens)", 32, most, min(384, most), key="stall-banquet")
    choices = [b for b in (16, 32, 64, 128, 256, 512) if b > tables]
    budgets = ui.multiselect(
        "Chunk budgets (tokens per step)", choices, default=choices[:5], key="stall-budgets"
    )
    repeats = ui.slider("Repeats (the median is drawn, with the range as a bar)", 3, 7, 3, key="stall-repeats")
    return StallSettings(
        tables=tables, banquet_prompt=banquet, budgets=tuple(budgets) or (64,), repeats=repeats
    )


EXPERIMENT = Experiment(
    key="stall",
    title="Don't stall the pot: a banquet arrives mid-service",
    nav_title="Don't stall the pot: chunked prefill",
    icon=":material/stockpot:",
    kitchen="Four tables are mid-soup when a banquet ticket lands. Toss the whole banquet before the next "
    "ladle and every table waits through one long pause. Toss it a handful at a time between ladles and "
    "the soup keeps its rhythm, while the banquet's first dish comes a little later.",
    engineering="Under `continuous` a step is prefill-only or decode-only, so the banquet's whole prompt is "
    "one pass and every decode waits for it: one inter-token gap spikes. `chunked` prefill gives each step "
    "a token budget: decodes first, then a chunk of the prompt, in one pass. We sweep the budget and plot "
    "the measured trade-off between the banquet's TTFT and the tables' worst gap.",
    predict=Prediction(
        question="Under continuous batching, how many times their usual gap is the tables' worst gap "
        "between tokens when the banquet arrives?",
        unit="x",
        min_value=0.1,
        max_value=1000.0,
        step=0.5,
        answer=lambda r: r.continuous.itl_max_s / r.continuous.itl_p50_s,
    ),
    form=settings_form,
    run=run_stall,
    figures=stall_figures,
    record=lambda info: StallSettings(banquet_prompt=min(384, info.max_context - 8)),
    story=StoryLink(
        ":material/stockpot: A banquet ticket lands while the soup is being served",
        "**Interference and chunked prefill**: a long prompt's prefill pass stalls every running decode; "
        "cutting it into chunks that share each step with the decodes keeps ITL flat, at some cost in TTFT.",
        "Lab: don't stall the pot (chunked prefill)",
    ),
    tables=lambda r: {"runs": r.to_frame(), "gaps": r.gaps_frame()},
    verdict=stall_verdict,
    verdict_on=lambda r: (
        f"{r.settings.tables} tables decoding, a {r.settings.banquet_prompt}-token banquet arriving"
    ),
)
