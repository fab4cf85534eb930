"""Experiment 8, the dinner rush: whole batches (static) against tickets joining mid-service (continuous).

Kitchen words: on a busy night orders arrive one by one. The old rule was to fill the pot with the
tables waiting, serve them all, and only then take new tickets: a table that wanted one bowl
waits for the table that wanted forty. The new rule: whenever a bowl is done and a place at the pot
is free, the next ticket joins at once, mid-service.

Engine words: `static` admits a batch when the engine is empty and runs it until its last
sequence finishes; `continuous` schedules per iteration (Orca, vLLM): finished sequences leave and
waiting ones join at every step (engine/scheduler.py). The same seeded Poisson stream of orders
(`engine.workload.make_requests`: exponential gaps, a mix of short answers and the odd long one)
is replayed in real time under each policy on the same weights (`lab.serve_replay`).

Measured per policy, vLLM's definitions (engine.bench.serve_bench.report): requests/s and output tokens/s
from the first arrival to the last finish; each request's TTFT and TPOT (their distributions are
drawn); and every step of the stove, with the tickets it held and its prefill and decode tokens,
for the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.bench.serve_bench import PolicyReport, report
from engine.errors import EngineError
from engine.workload import Dist, make_requests
from lab.experiment import Experiment, Prediction, StoryLink
from lab.noise import Machine, MachineWatch
from lab.plot_kit import GREY, POT, WOK, finish, guess_marker
from lab.progress import ProgressFn, ProgressTracker
from lab.serve_replay import ReplayResult, replay, serving_engine, warm_up
from lab.serving_verdicts import PolicyNumbers, diagnose_rush

POLICIES = ("static", "continuous")
SLO_TTFT_S, SLO_TPOT_S = 1.0, 0.1  # the benchmark's goodput defaults; only counted in its report


@dataclass(frozen=True)
class RushSettings:
    requests: int = 48
    rate: float = 80.0  # mean arrivals per second (Poisson)
    prompt_min: int = 16
    prompt_max: int = 64
    short_answer: int = 8  # tokens most orders want
    long_answer: int = 160  # tokens of the odd long order
    long_every: int = 6  # one order in this many (on average) wants the long answer
    max_seqs: int = 16  # places at the pot
    seed: int = 0


@dataclass(frozen=True)
class PolicyRun:
    policy: str
    report: PolicyReport  # the benchmark's numbers for this stream under this policy
    served: ReplayResult  # every request's result and every step of the stove

    def numbers(self) -> PolicyNumbers:
        """What the inspector reads from this run."""
        r, e2e = self.report, sorted(x.metrics.e2e_s for x in self.served.results)
        return PolicyNumbers(
            self.policy,
            r.requests_per_s,
            r.ttft_s["p50"],
            r.ttft_s["p99"],
            r.tpot_s["p50"],
            e2e[len(e2e) // 2],
        )


@dataclass(frozen=True)
class RushResult:
    settings: RushSettings
    runs: list[PolicyRun]
    notes: list[str]
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def run(self, policy: str) -> PolicyRun:
        return next(r for r in self.runs if r.policy == policy)

    @property
    def speedup(self) -> float:
        """continuous / static requests per second: what the prediction asks."""
        return self.run("continuous").report.requests_per_s / self.run("static").report.requests_per_s

    def to_frame(self) -> pd.DataFrame:
        """One row per policy."""
        rows = []
        for run in self.runs:
            r = run.report
            rows.append(
                {"policy": run.policy, "requests": r.requests, "duration_s": r.duration_s,
                 "requests_per_s": r.requests_per_s, "tokens_per_s": r.tokens_per_s,
                 "ttft_p50_s": r.ttft_s["p50"], "ttft_p99_s": r.ttft_s["p99"],
                 "tpot_p50_s": r.tpot_s["p50"], "tpot_p99_s": r.tpot_s["p99"], "steps": r.steps}
            )  # fmt: skip
        return pd.DataFrame(rows)

    def tickets_frame(self) -> pd.DataFrame:
        """One row per request per policy: when it arrived, waited, got its first token, finished."""
        rows = []
        for run in self.runs:
            for i, (arrival, res) in enumerate(zip(run.served.arrivals_s, run.served.results, strict=True)):
                m = res.metrics
                rows.append(
                    {"policy": run.policy, "ticket": i + 1, "arrival_s": arrival, "queue_s": m.queue_s,
                     "ttft_s": m.ttft_s, "tpot_s": m.tpot_s, "e2e_s": m.e2e_s,
                     "prompt_tokens": m.prompt_tokens, "output_tokens": m.output_tokens}
                )  # fmt: skip
        return pd.DataFrame(rows)


def check(engine, s: RushSettings) -> None:
    """Refuse settings the stream cannot be served with, in one line naming the limit."""
    ctx = engine.info.max_context
    if not 2 <= s.requests <= 400:
        raise EngineError(f"dinner rush: requests must be between 2 and 400 (got {s.requests})")
    if not s.rate > 0:
        raise EngineError(f"dinner rush: the arrival rate must be above 0 orders per second (got {s.rate})")
    if not 1 <= s.prompt_min <= s.prompt_max or not 1 <= s.short_answer <= s.long_answer or s.long_every < 1:
        raise EngineError("dinner rush: lengths must be at least 1, with min <= max and short <= long")
    if s.prompt_max + s.long_answer > ctx:
        raise EngineError(
            f"dinner rush: longest prompt {s.prompt_max} + long answer {s.long_answer} tokens "
            f"= {s.prompt_max + s.long_answer}; the model's context is {ctx}"
        )


def run_dinner_rush(engine, settings: RushSettings, on_progress: ProgressFn | None = None) -> RushResult:
    """The same seeded stream under static and under continuous batching."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    s = settings
    check(engine, s)
    answers = Dist("choice", (s.short_answer,) * (s.long_every - 1) + (s.long_answer,))
    prompts = Dist("uniform", (s.prompt_min, s.prompt_max))
    requests = make_requests(s.requests, s.rate, prompts, answers, s.seed, engine.info.vocab_size)
    tracker = ProgressTracker([1.0, 1.0], on_progress)  # static first: the longer run, so the ETA errs long
    runs = []
    for policy in POLICIES:
        eng = serving_engine(engine, policy, max_seqs=s.max_seqs, max_seq_len=s.prompt_max + s.long_answer)
        warm_up(eng, engine.info.vocab_size)
        served = replay(eng, requests)
        steps = len(served.steps)
        runs.append(
            PolicyRun(policy, report(served.results, served.span_s, steps, SLO_TTFT_S, SLO_TPOT_S), served)
        )
        tracker.step(f"{policy}: {runs[-1].report.requests_per_s:.1f} requests/s")
    result = RushResult(s, runs, [])
    st, co = result.run("static").report, result.run("continuous").report
    result.notes.extend([
        f"the same {s.requests} orders (seed {s.seed}, {s.rate:g}/s): continuous served "
        f"{result.speedup:.2f}x the requests/s of static ({co.requests_per_s:.1f} vs {st.requests_per_s:.1f})",
        f"TTFT p50 {co.ttft_s['p50'] * 1e3:.0f} ms continuous vs {st.ttft_s['p50'] * 1e3:.0f} ms static; "
        f"TPOT p50 {co.tpot_s['p50'] * 1e3:.1f} vs {st.tpot_s['p50'] * 1e3:.1f} ms",
    ])  # fmt: skip
    return watch.stamp(result)


# -- figures --------------------------------------------------------------------------------------


def timeline_figure(result: RushResult) -> go.Figure:
    """A Gantt chart per policy: the stove's passes on top, then each ticket: waiting, wok, pot."""
    fig = make_subplots(rows=len(result.runs), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{r.policy} batching" for r in result.runs])  # fmt: skip
    for row, run in enumerate(result.runs, start=1):
        first = row == 1
        tickets = result.tickets_frame().query("policy == @run.policy")
        labels = [f"ticket {t}" for t in tickets.ticket]
        parts = (
            ("waiting in line", GREY, tickets.arrival_s, tickets.queue_s),
            ("in the wok (until the first token)", WOK, tickets.arrival_s + tickets.queue_s,
             tickets.ttft_s - tickets.queue_s),
            ("at the pot (decode)", POT, tickets.arrival_s + tickets.ttft_s, tickets.e2e_s - tickets.ttft_s),
        )  # fmt: skip
        for name, colour, start, length in parts:
            fig.add_trace(
                go.Bar(y=labels, x=length, base=start, orientation="h", marker_color=colour, name=name,
                       showlegend=first, legendgroup=name),
                row=row, col=1,
            )  # fmt: skip
        steps = run.served.steps
        colours = [
            WOK if st.phase == "prefill" else POT if st.phase == "decode" else "#f0a202" for st in steps
        ]
        fig.add_trace(
            go.Bar(y=["stove"] * len(steps), x=[st.end_s - st.start_s for st in steps],
                   base=[st.start_s for st in steps], orientation="h", marker_color=colours,
                   name="stove: one pass each", showlegend=first,
                   hovertext=[f"{len(st.request_ids)} tickets, {st.prefill_tokens} prefill + "
                              f"{st.decode_tokens} decode tokens" for st in steps]),
            row=row, col=1,
        )  # fmt: skip
        fig.update_yaxes(autorange="reversed", categoryorder="array", row=row, col=1,
                         categoryarray=["stove", *labels], showticklabels=False)  # fmt: skip
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title="seconds after the rush began", row=len(result.runs), col=1)
    finish(fig, "The dinner rush: each ticket waiting, in the wok, at the pot (top row: the stove)")
    fig.update_layout(height=700)
    return fig


def rush_figures(result: RushResult, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    served = go.Figure(
        go.Bar(x=df.policy, y=df.requests_per_s, marker_color=[GREY, POT][: len(df)],
               text=[f"{v:.1f}/s" for v in df.requests_per_s], textposition="outside", name="measured")
    )  # fmt: skip
    if guess is not None:
        static = result.run("static").report.requests_per_s
        served.add_trace(guess_marker("continuous", static * guess, f"your guess: {guess:g}x"))
    served.update_yaxes(title="requests served per second", rangemode="tozero")
    finish(served, "Guests served per second, same orders: static vs continuous batching")

    tickets = result.tickets_frame()
    dist = make_subplots(rows=1, cols=2, subplot_titles=["TTFT (ms)", "TPOT (ms)"])
    for col, metric in ((1, "ttft_s"), (2, "tpot_s")):
        for policy, colour in zip(POLICIES, (GREY, POT), strict=True):
            part = tickets[tickets.policy == policy]
            dist.add_trace(
                go.Box(y=part[metric] * 1e3, name=policy, marker_color=colour, boxpoints="all",
                       jitter=0.4, showlegend=False),
                row=1, col=col,
            )  # fmt: skip
    dist.update_yaxes(type="log")
    finish(dist, "What each guest felt: first-token wait and gap between tokens, per request")
    return [served, dist, timeline_figure(result)]


# -- the experiment -------------------------------------------------------------------------------


def rush_verdict(result: RushResult, roof=None, dtype: str | None = None):
    return diagnose_rush(result.run("static").numbers(), result.run("continuous").numbers())


def settings_form(ui, info) -> RushSettings:
    requests = ui.slider("Orders in the rush", 8, 96, 48, key="dinner_rush-requests")
    rate = ui.slider("Arrivals per second (mean)", 5, 150, 80, key="dinner_rush-rate")
    long_answer = ui.slider(
        "Tokens of the odd long order", 16, max(16, min(320, info.max_context - 64)),
        min(160, info.max_context - 64), key="dinner_rush-long",
    )  # fmt: skip
    long_every = ui.slider("One long order in every", 2, 16, 6, key="dinner_rush-every")
    seed = ui.number_input("Seed of the stream", 0, 10_000, 0, key="dinner_rush-seed")
    return RushSettings(requests=requests, rate=float(rate), long_answer=long_answer, long_every=long_every,
                        seed=int(seed))  # fmt: skip


EXPERIMENT = Experiment(
    key="dinner_rush",
    title="The dinner rush: take new tickets mid-service?",
    nav_title="Dinner rush: continuous batching",
    icon=":material/room_service:",
    kitchen="Tickets arrive all evening, most for a single bowl, now and then one for a whole tureen. "
    "Serve in rounds, and the tables that wanted one bowl wait for the tureen before the next round "
    "starts. Let each new ticket take the first free place at the pot, and nobody waits for a "
    "stranger's order.",
    engineering="`static` batching admits a batch when the engine is empty and runs it to its last "
    "sequence; `continuous` (iteration-level) scheduling lets finished sequences leave and waiting ones "
    "join at every step. The same seeded Poisson stream is replayed in real time under both: requests/s, "
    "TTFT and TPOT per request, and a timeline of every step.",
    predict=Prediction(
        question="How many times more requests per second will continuous batching serve than static?",
        unit="x",
        min_value=0.1,
        max_value=100.0,
        step=0.5,
        answer=lambda r: r.speedup,
    ),
    form=settings_form,
    run=run_dinner_rush,
    figures=rush_figures,
    record=lambda info: RushSettings(long_answer=min(160, info.max_context - 64)),
    story=StoryLink(
        ":material/room_service: The dinner rush",
        "**Continuous batching**: requests join and leave the running batch at every step instead of "
        "waiting for the whole batch to finish, so short answers are not held behind long ones.",
        "Lab: dinner rush (continuous vs static batching)",
    ),
    tables=lambda r: {"policies": r.to_frame(), "tickets": r.tickets_frame()},
    verdict=rush_verdict,
    verdict_on=lambda r: f"{r.settings.requests} orders under static and continuous",
)
