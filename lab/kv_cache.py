"""Experiment 4, keep the soup warm: the same meal with three kinds of serving counter.

Kitchen words: the wok's finished dish slides onto the warm serving counter (the KV cache), and the
soup pot ladles from it. Take the counter away and every spoonful means re-cooking the whole meal
so far, so each ladle is slower than the last. A counter that must be rebuilt bigger for every
spoonful (`growing`) works, but keeps moving the whole meal; a counter sized once (`static`) just
takes the next bowl.

Engine words: `static` preallocates K/V for the whole request (prompt + new tokens) and writes one
column per step, so step time stays ~flat; `growing` concatenates a column each step (copies the
cache: traffic grows with position); `none` recomputes K/V for the whole sequence every step, so
step time grows ~linearly
with position (and total work quadratically). All three must produce the same tokens.

Measured per mode: `repeats` (at least three) generations of `new_tokens` tokens, greedy, the modes
taking turns; every decode step's wall time (the median of the repeats at that position, with their
range drawn), its process CPU time (`lab.cpu_time`: immune to waiting for a core on a busy machine)
and the KV bytes live after it. Growth is the ratio of the median of the last fifth of steps to the
median of the first fifth, per repeat, for wall time (`growth`) and CPU time (`cpu_growth`); a mode's
steps are said to grow more than another's only where those ranges do not overlap (`lab.noise`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from engine.errors import EngineError
from lab.cpu_time import generate_timed
from lab.experiment import Experiment, Prediction, StoryLink
from lab.model_for import ASSISTANT
from lab.noise import (
    MIN_REPEATS,
    SPREAD_LEGEND,
    Machine,
    MachineWatch,
    Spread,
    clearly_apart,
    error_bars,
    spread_of,
)
from lab.plot_kit import GREY, MODE_COLOURS, POT, cpu_time_line, finish, guess_marker, series
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.sample import Sample, sample_of
from lab.workload import check_fits, prompt_ids

MODES = ("static", "growing", "none")


@dataclass(frozen=True)
class KvSettings:
    prompt_len: int = 16
    new_tokens: int = 256
    modes: tuple[str, ...] = MODES
    repeats: int = 3


@dataclass(frozen=True)
class KvRun:
    mode: str
    step_s: list[float]  # decode steps' wall time, in order (step 1 = the second output token); medians
    cpu_s: list[float]  # the same steps' process CPU time; medians of the repeats
    kv_mb: list[float]  # live KV cache after each decode step, MB
    kv_allocated_mb: float
    tokens: list[int]  # generated ids (to check that all modes agree)
    growth_ratio: float  # late-steps median / early-steps median, wall time (median of the repeats)
    cpu_growth_ratio: float  # the same for CPU time
    step_range: list[Spread]  # each step's wall time over the repeats (seconds)
    growth: Spread  # growth_ratio of each repeat
    cpu_growth: Spread


@dataclass(frozen=True)
class KvResult:
    settings: KvSettings
    runs: list[KvRun]
    same_tokens: bool  # every mode generated the same ids
    sample: Sample
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"  # CPU time is meaningful only when the work runs on the CPU
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def run(self, mode: str) -> KvRun:
        return next(r for r in self.runs if r.mode == mode)

    def to_frame(self) -> pd.DataFrame:
        """Long format: one row per (mode, decode step)."""
        rows = []
        for r in self.runs:
            for i, (s, cpu, mb) in enumerate(zip(r.step_s, r.cpu_s, r.kv_mb, strict=True), start=1):
                rows.append(
                    {
                        "mode": r.mode,
                        "step": i,
                        "position": self.settings.prompt_len + i,
                        "step_ms": s * 1e3,
                        "cpu_ms": cpu * 1e3,
                        "kv_mb": mb,
                    }
                )
        return pd.DataFrame(rows)


def growth_ratio(step_s: list[float]) -> float:
    """Median of the last fifth of steps over the median of the first fifth (1.0 = flat)."""
    if len(step_s) < 5:
        return 1.0
    fifth = len(step_s) // 5
    early = median_of(step_s[:fifth])
    return median_of(step_s[-fifth:]) / early if early > 0 else 1.0


def measure_once(engine, ids: list[int], mode: str, new_tokens: int):
    return generate_timed(
        engine, [ids], max_new_tokens=new_tokens, temperature=0.0, stop_at_eos=False, cache=mode
    )


def kv_run(mode: str, repeats: list) -> tuple[KvRun, Sample, bool]:
    """One mode's repeats as one run: per-step medians and ranges; whether every repeat agreed."""
    res = repeats[-1].result
    steps = res.trace.decode_steps
    walls = [[st.seconds for st in t.result.trace.decode_steps] for t in repeats]  # (repeats, steps)
    cpus = [t.decode_cpu_s for t in repeats]
    step_range = [spread_of(col) for col in zip(*walls, strict=True)]
    growth = spread_of([growth_ratio(w) for w in walls])
    cpu_growth = spread_of([growth_ratio(c) for c in cpus])
    run = KvRun(
        mode=mode,
        step_s=[sp.median for sp in step_range],
        cpu_s=[median_of(col) for col in zip(*cpus, strict=True)],
        kv_mb=[s.kv_bytes / 1e6 for s in steps],
        kv_allocated_mb=res.metrics.kv_cache_allocated_bytes / 1e6,
        tokens=list(res.tokens[0]),
        growth_ratio=growth.median,
        cpu_growth_ratio=cpu_growth.median,
        step_range=step_range,
        growth=growth,
        cpu_growth=cpu_growth,
    )
    agreed = all(list(t.result.tokens[0]) == run.tokens for t in repeats)
    return run, sample_of(res, f"cache={mode}"), agreed


def growth_finding(run: KvRun, flat: KvRun, machine: Machine, on_cpu: bool) -> str:
    """Whether `run`'s late steps slow down more than `flat`'s, said only beyond the repeats' spread.

    On a CPU it is judged on CPU time, which waiting for a core does not stretch.
    """
    a, b = (run.cpu_growth, flat.cpu_growth) if on_cpu else (run.growth, flat.growth)
    if clearly_apart(a, b):
        word = "more" if a.median > b.median else "less"
        return (f"cache={run.mode}: late steps slow down {word} than cache={flat.mode}'s "
                f"({a.median:.2f}x against {b.median:.2f}x), by more than the repeats vary")  # fmt: skip
    return machine.too_noisy(f"whether cache={run.mode}'s steps grow more than cache={flat.mode}'s")


def calibrated_units(engine, ids: list[int], s: KvSettings) -> list[float]:
    """Expected cost of each mode for the ETA, from two measured warm-up runs.

    A cached step costs about one decode step; a recompute step costs about a prefill of the
    sequence so far (mid-run: prompt + new_tokens / 2 tokens). Both are timed here, so the ETA
    rests on this machine's speed, not a guess. The runs also warm the engine up.
    """
    decode = engine.generate([ids], max_new_tokens=4, stop_at_eos=False).trace.decode_steps
    step_s = median_of([st.seconds for st in decode])
    mid = prompt_ids(engine, s.prompt_len + s.new_tokens // 2)
    recompute_s = engine.generate([mid], max_new_tokens=1, stop_at_eos=False).trace.prefill.seconds
    modes = list(dict.fromkeys(s.modes))  # one unit per (repeat, mode), the order they run in
    return [s.new_tokens * (recompute_s if m == "none" else step_s)
            for _ in range(max(MIN_REPEATS, s.repeats)) for m in modes]  # fmt: skip


def run_kv_cache(engine, settings: KvSettings, on_progress: ProgressFn | None = None) -> KvResult:
    """Per-step latency and KV memory for each cache mode, same prompt, same greedy tokens."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    unknown = [m for m in settings.modes if m not in MODES]
    if unknown or not settings.modes:
        raise EngineError(f"keep the soup warm: unknown cache mode(s) {unknown}; use {', '.join(MODES)}")
    if settings.new_tokens < 10:
        raise EngineError(f"keep the soup warm: new_tokens must be at least 10, got {settings.new_tokens}")
    check_fits(engine, settings.prompt_len, settings.new_tokens, "keep the soup warm")
    ids = prompt_ids(engine, settings.prompt_len)
    n = settings.new_tokens
    tracker = ProgressTracker(calibrated_units(engine, ids, settings), on_progress)
    modes = list(dict.fromkeys(settings.modes))
    timed = {m: [] for m in modes}
    for r in range(max(MIN_REPEATS, settings.repeats)):  # the modes take turns: a busy moment hits all
        for mode in modes:
            timed[mode].append(measure_once(engine, ids, mode, n))
            last = timed[mode][-1].result.trace.decode_steps[-1].seconds
            tracker.step(f"cache={mode}, repeat {r + 1}: last step {last * 1e3:.1f} ms")
    runs, samples, agreed = [], {}, True
    for mode in modes:
        run, samples[mode], ok = kv_run(mode, timed[mode])
        runs.append(run)
        agreed = agreed and ok
    same = agreed and all(r.tokens == runs[0].tokens for r in runs)
    notes = [
        f"cache={r.mode}: the last fifth of steps takes {r.growth_ratio:.2f}x the first fifth's wall time "
        f"({r.cpu_growth_ratio:.2f}x CPU time); "
        f"peak KV {max(r.kv_mb, default=0):.2f} MB live, {r.kv_allocated_mb:.2f} MB allocated"
        for r in runs
    ]
    notes.append(
        "all modes generated the same tokens" if same else "WARNING: the modes generated different tokens"
    )
    machine, device = watch.finish(), str(engine.info.device)
    flat = next((r for r in runs if r.mode == "static"), None)
    notes += [growth_finding(r, flat, machine, device == "cpu") for r in runs if flat and r is not flat]
    sample = samples.get("static") or samples[modes[0]]
    return KvResult(settings=settings, runs=runs, same_tokens=same, sample=sample, notes=notes, device=device,
                    machine=machine)  # fmt: skip


# -- figures --------------------------------------------------------------------------------------


def kv_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    lat, mem = go.Figure(), go.Figure()
    for mode, part in df.groupby("mode", sort=False):
        colour = MODE_COLOURS.get(mode, GREY)
        lat.add_trace(series(part.position, part.step_ms, f"cache={mode} (wall, median)", colour, mode="lines",
                             spread=error_bars(result.run(mode).step_range, 1e3)))  # fmt: skip
        if result.device == "cpu":  # on a GPU the host's CPU time is not the step's work
            lat.add_trace(cpu_time_line(part.position, part.cpu_ms, f"cache={mode} (CPU time)", colour))
        mem.add_trace(
            go.Scatter(
                x=part.position, y=part.kv_mb, mode="lines", name=f"cache={mode}", line=dict(color=colour)
            )
        )
    for run in result.runs:
        if run.mode == "static" and run.kv_allocated_mb > 0:  # the counter is built full-size up front
            mem.add_trace(
                series(
                    [df.position.min(), df.position.max()],
                    [run.kv_allocated_mb] * 2,
                    "cache=static, allocated up front",
                    POT,
                    mode="lines",
                    dash="dash",
                )
            )
    if guess is not None and "none" in set(df["mode"]):
        none = df[df["mode"] == "none"]
        fifth = max(1, len(none) // 5)
        lat.add_trace(
            guess_marker(
                none.position.iloc[-1], none.step_ms.iloc[:fifth].median() * guess, f"your guess: {guess:g}x"
            )
        )
    lat.update_xaxes(title="sequence position (tokens so far)")
    lat.update_yaxes(title=f"decode step (ms; {SPREAD_LEGEND})", rangemode="tozero")
    mem.update_xaxes(title="sequence position (tokens so far)")
    mem.update_yaxes(title="KV cache live (MB)", rangemode="tozero")
    return [
        finish(lat, "Keep the soup warm: per-step latency with and without the KV cache"),
        finish(mem, "The serving counter fills up: KV cache memory over the generation"),
    ]


# -- the experiment -------------------------------------------------------------------------------


BIG_MODEL_BYTES = 64e6  # past this, the default is fewer decode steps (`default_steps`)


def default_steps(info) -> int:
    """256 decode steps, or 64 for a model of more than 64 MB of weights: `none` recooks the whole meal
    at every step, so its work grows with steps squared times the weights. Measured on a 2-core CPU
    (busy, load 8): the assistant's 64 steps took about two minutes in all; 256 more than five."""
    return 64 if info.weight_bytes > BIG_MODEL_BYTES else 256


def settings_form(ui, info) -> KvSettings:
    prompt_len = ui.slider("Prompt length (tokens)", 4, 64, 16, key="kv-prompt")
    most = max(16, min(1024, info.max_context - prompt_len))
    new_tokens = ui.slider("Decode steps", 16, most, min(default_steps(info), most), key="kv-new")
    modes = ui.multiselect("Cache modes", MODES, default=list(MODES), key="kv-modes")
    return KvSettings(prompt_len=prompt_len, new_tokens=new_tokens, modes=tuple(modes) or MODES)


EXPERIMENT = Experiment(
    key="kv_cache",
    title="Keep the soup warm: the KV cache",
    nav_title="KV cache: keep the soup warm",
    icon=":material/local_fire_department:",
    kitchen="The wok's finished dish slides onto the warm serving counter and the soup pot ladles from it. "
    "Without the counter, every spoonful means cooking the whole meal again, so each ladle is slower than "
    "the last. A counter that is rebuilt bigger for every spoonful works, but keeps moving the meal.",
    engineering="`static` preallocates K/V for the whole order (prompt + new tokens) and writes one column "
    "per step; `growing` "
    "concatenates (copies the cache every step); `none` recomputes the whole sequence every step. Same "
    "tokens, very different per-step latency.",
    predict=Prediction(
        question="Without a cache, how many times slower is a late decode step than an early one?",
        unit="x",
        min_value=0.1,
        max_value=1000.0,
        step=0.5,
        answer=lambda r: r.run("none").growth_ratio if "none" in [x.mode for x in r.runs] else float("nan"),
    ),
    form=settings_form,
    run=run_kv_cache,
    figures=kv_figures,
    record=lambda info: KvSettings(prompt_len=16, new_tokens=min(256, info.max_context - 32)),
    story=StoryLink(
        ":material/countertops: The serving counter",
        "The **KV cache**: the keys and values prefill computed are handed to decode as they are, so decode "
        "never recomputes the prompt. No cold restart.",
        "Lab: keep the soup warm (KV cache)",
    ),
    tables=lambda r: {"steps": r.to_frame()},
    model=ASSISTANT,  # the pot reads its weights from memory only when they do not fit in a cache
)
