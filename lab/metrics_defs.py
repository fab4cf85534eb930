"""Experiment 7, metrics defined: one recorded token stream, measured under every common definition.

Kitchen words: "how fast is the soup?" depends on who holds the stopwatch. One inspector starts at
the first bowl; another starts when the guest sat down; a third divides the whole dinner by the
number of bowls. Same dinner, different numbers, and none is wrong: they answer different questions.

Engine words, for a stream whose first token lands at TTFT and last at E2E, n tokens per sequence:
  vLLM TPOT             = (E2E - TTFT) / (n - 1)        decode only; excludes the first token
  ITL (per token)       = each gap between consecutive tokens; mean ~ TPOT, but p99 shows hiccups
  llmperf-style ITL     = (TTFT + sum of gaps) / n = E2E / n   the first gap is TTFT itself, so a
                          slow prefill inflates "inter-token latency"
  tokens/s incl. prefill  = output tokens / E2E            what a user's stopwatch sees
  tokens/s decode only    = (output tokens - batch) / (E2E - TTFT)  the soup pot's own speed
Worked example: TTFT 0.5 s, then 9 more tokens 0.05 s apart: E2E 0.95 s, TPOT 50 ms, llmperf ITL
95 ms, 10.5 tok/s with prefill, 20 tok/s decode only.

Measured: one greedy generation (batch, prompt length, tokens as set); all figures derive from the
engine's trace of that single run, so their differences are purely definitional.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.errors import EngineError
from lab.experiment import Experiment, Prediction, StoryLink
from lab.noise import Machine, MachineWatch
from lab.plot_kit import POT, WOK, finish, guess_marker
from lab.progress import ProgressFn, ProgressTracker
from lab.sample import Sample, sample_of
from lab.workload import batch_prompts, check_fits


@dataclass(frozen=True)
class MetricsSettings:
    prompt_len: int = 256
    new_tokens: int = 32
    batch: int = 1


@dataclass(frozen=True)
class Definition:
    name: str
    tool: str  # who reports it this way
    value: float
    unit: str  # "ms" or "tok/s"
    formula: str
    includes_prefill: bool  # does the wok's time (TTFT) enter this number?


@dataclass(frozen=True)
class MetricsResult:
    settings: MetricsSettings
    token_times_s: list[float]  # when each output token (of the longest sequence) was ready
    definitions: list[Definition]
    sample: Sample
    notes: list[str] = field(default_factory=list)
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def value(self, name: str) -> float:
        return next(d.value for d in self.definitions if d.name == name)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([d.__dict__ for d in self.definitions])

    def stream_frame(self) -> pd.DataFrame:
        t = self.token_times_s
        gaps = [t[0]] + [b - a for a, b in zip(t[:-1], t[1:], strict=True)]
        return pd.DataFrame({"token": range(1, len(t) + 1), "time_s": t, "gap_ms": np.array(gaps) * 1e3})


def definitions_from(token_times: list[float], output_tokens: int, batch: int) -> list[Definition]:
    """Every definition, computed from one stream's token times (seconds since request start)."""
    n = len(token_times)
    ttft, e2e = token_times[0], token_times[-1]
    gaps = np.diff(token_times)  # (n - 1,)
    tpot = (e2e - ttft) / (n - 1)
    return [
        Definition("TTFT", "all tools", ttft * 1e3, "ms", "first token time", True),
        Definition("TPOT", "vLLM benchmark_serving", tpot * 1e3, "ms", "(E2E - TTFT) / (n - 1)", False),
        Definition(
            "ITL mean", "vLLM, per-token gaps", float(gaps.mean()) * 1e3, "ms", "mean of token gaps", False
        ),
        Definition(
            "ITL p50", "vLLM, per-token gaps", float(np.percentile(gaps, 50)) * 1e3, "ms", "median gap", False
        ),
        Definition(
            "ITL p99",
            "vLLM, per-token gaps",
            float(np.percentile(gaps, 99)) * 1e3,
            "ms",
            "99th pct gap",
            False,
        ),
        Definition(
            "ITL incl. TTFT", "llmperf", e2e / n * 1e3, "ms", "(TTFT + sum of gaps) / n = E2E / n", True
        ),
        Definition("E2E", "all tools", e2e * 1e3, "ms", "last token time", True),
        Definition(
            "tokens/s incl. prefill",
            "user's stopwatch, llmperf",
            output_tokens / e2e,
            "tok/s",
            "output tokens / E2E",
            True,
        ),
        Definition(
            "tokens/s decode only",
            "engine logs",
            (output_tokens - batch) / (e2e - ttft),
            "tok/s",
            "(output tokens - batch) / (E2E - TTFT)",
            False,
        ),
        Definition(
            "1 / TPOT", "per-user decode speed", 1 / tpot, "tok/s", "one sequence's decode rate", False
        ),
    ]


def run_metrics(engine, settings: MetricsSettings, on_progress: ProgressFn | None = None) -> MetricsResult:
    """Record one stream and report it under each definition."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    if settings.new_tokens < 3:
        raise EngineError(
            f"metrics defined: new_tokens must be at least 3 to have gaps, got {settings.new_tokens}"
        )
    check_fits(engine, settings.prompt_len, settings.new_tokens, "metrics defined")
    tracker = ProgressTracker([1], on_progress)
    prompts = batch_prompts(engine, settings.batch, settings.prompt_len)
    engine.generate(prompts[:1], max_new_tokens=2, stop_at_eos=False)  # warm-up
    res = engine.generate(prompts, max_new_tokens=settings.new_tokens, temperature=0.0, stop_at_eos=False)
    times = [res.trace.t_first_token] + [s.t_end for s in res.trace.decode_steps]
    defs = definitions_from(times, res.metrics.output_tokens, settings.batch)
    tracker.step(f"{len(times)} tokens recorded")
    by = {d.name: d.value for d in defs}
    notes = [
        f"TPOT {by['TPOT']:.1f} ms vs llmperf-style ITL {by['ITL incl. TTFT']:.1f} ms: the same stream, "
        f"{by['ITL incl. TTFT'] / by['TPOT']:.2f}x apart because one counts the wok's time",
        f"tokens/s {by['tokens/s incl. prefill']:.1f} with prefill vs "
        f"{by['tokens/s decode only']:.1f} decode only",
    ]
    return watch.stamp(MetricsResult(
        settings=settings,
        token_times_s=times,
        definitions=defs,
        sample=sample_of(res, "recorded stream"),
        notes=notes,
    ))


# -- figures --------------------------------------------------------------------------------------


def metrics_figures(result, guess: float | None = None) -> list[go.Figure]:
    stream = result.stream_frame()
    timeline = go.Figure(
        go.Bar(
            x=stream.token,
            y=stream.gap_ms,
            marker_color=[WOK] + [POT] * (len(stream) - 1),
            name="gap before token (ms)",
        )
    )
    timeline.update_xaxes(title="output token")
    timeline.update_yaxes(title="wait before this token (ms)", type="log")
    finish(timeline, "One recorded stream: the first wait is the wok (TTFT), the rest are ladles")

    defs = result.to_frame()
    bars = definition_bars(defs[defs.unit == "ms"])
    if guess is not None:
        bars.add_trace(
            guess_marker("ITL incl. TTFT", result.value("TPOT") * guess, f"your guess: {guess:g}x TPOT")
        )
    bars.update_yaxes(title="ms", type="log")
    finish(bars, "Same stream, different stopwatches (orange: includes the wok's TTFT)")
    rates = definition_bars(defs[defs.unit == "tok/s"])
    rates.update_yaxes(title="tokens / s")
    return [timeline, bars, finish(rates, "Same stream, different throughputs")]


def definition_bars(rows) -> go.Figure:
    """One bar per metric definition, its formula on hover. Orange: the number includes the wok's
    time (TTFT); teal: the soup pot's alone."""
    return go.Figure(
        go.Bar(
            x=rows.name,
            y=rows.value,
            marker_color=[WOK if p else POT for p in rows.includes_prefill],
            hovertext=rows.formula,
            text=[f"{v:.1f}" for v in rows.value],
            textposition="outside",
        )
    )


# -- the experiment -------------------------------------------------------------------------------


def settings_form(ui, info) -> MetricsSettings:
    prompt_len = ui.slider(
        "Prompt length (tokens)",
        8,
        max(8, min(1024, info.max_context // 2)),
        min(256, info.max_context // 2),
        key="metrics-prompt",
    )
    new_tokens = ui.slider("New tokens", 8, 128, 32, key="metrics-new")
    batch = ui.select_slider("Batch", options=[1, 2, 4, 8], value=1, key="metrics-batch")
    return MetricsSettings(prompt_len=prompt_len, new_tokens=new_tokens, batch=batch)


EXPERIMENT = Experiment(
    key="metrics",
    title="Metrics, defined: who holds the stopwatch?",
    nav_title="Metrics, defined",
    icon=":material/straighten:",
    kitchen="“How fast is the soup?” depends on who times it. One inspector starts at the first bowl, "
    "another when the guest sat down, a third divides the whole dinner by the number of bowls. Same dinner, "
    "different numbers, none of them wrong.",
    engineering="One recorded token stream, reported as vLLM's TPOT, per-token ITL (mean, p50, p99), "
    "llmperf's ITL (which counts TTFT as the first gap), and tokens/s with and without prefill. The spread "
    "is purely definitional: it is the same run.",
    predict=Prediction(
        question="How many times larger is an llmperf-style ITL than vLLM's TPOT for this stream?",
        unit="x",
        min_value=0.1,
        max_value=1000.0,
        step=0.1,
        answer=lambda r: r.value("ITL incl. TTFT") / r.value("TPOT"),
    ),
    form=settings_form,
    run=run_metrics,
    figures=metrics_figures,
    record=lambda info: MetricsSettings(prompt_len=min(256, info.max_context // 2), new_tokens=32),
    story=StoryLink(
        ":material/menu_book: The complaints book",
        "**Two panels, not one latency**: TTFT for the wok, TPOT and tokens/s for the pot, because they have "
        "different causes and different fixes.",
        "Lab: metrics, defined",
    ),
    tables=lambda r: {"definitions": r.to_frame(), "stream": r.stream_frame()},
)
