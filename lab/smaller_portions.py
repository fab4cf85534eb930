"""Experiment: smaller portions -- the same model with int8, bfloat16 and float32 weights.

Kitchen words: the soup pot's slow part is carrying the whole pantry to the stove for every
spoonful. Pack the pantry in smaller boxes (one byte per weight instead of four) and each trip is
shorter, so the ladle comes faster -- as long as the trip was the slow part. The wok was never
waiting for the pantry: it was busy tossing, so smaller boxes change nothing there, unless the
cook also tosses differently.

Engine words: a batch-1 decode step reads every weight once for two FLOPs per weight, so its time
follows the bytes read; int8 weights (engine/quant.py) read ~4x fewer bytes than float32 and ~2x
fewer than bfloat16. Prefill does hundreds of FLOPs per weight byte, so the bytes do not decide
it -- the arithmetic does. Our int8 prefill multiplies in bfloat16 (it widens the int8 weight to
bf16 for the GEMM), so compare its prefill with the bfloat16 row, which does the same arithmetic;
a CPU with fast bf16 units (AMX) makes both faster than float32 for that reason, not for the bytes.

Measured per variant (the same model loaded again in each precision, in this engine's process):
the median decode step of `new_tokens` tokens after a `prompt_len` prompt, and the median prefill
pass of one `prefill_tokens` prompt, every variant once per repeat in a rotated order so a noisy
moment hits all alike, after one untimed warm-up of every shape; at least three repeats, each
point the median of the repeats with their range drawn, and "faster" said only where the ranges do
not overlap (`lab.noise`); then each variant's greedy tokens against float32's over
`agreement_tokens` tokens, and its next-token distributions against float32's on float32's own
continuation, as llama.cpp measures its quants (engine/fidelity.py: KL divergence, same top-1,
perplexity ratio).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import pandas as pd
import plotly.graph_objects as go

from engine import Engine
from engine.errors import EngineError
from engine.fidelity import Fidelity, measure, prefix_agreement
from engine.limits import available_memory
from lab.cpu_time import generate_timed
from lab.experiment import Experiment, Prediction, StoryLink, decode_verdict
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
from lab.plot_kit import POT, WOK, finish, guess_marker
from lab.progress import ProgressFn, ProgressTracker, median_of
from lab.sample import Sample, sample_of
from lab.workload import check_fits, prompt_ids

VARIANTS = ("float32", "bfloat16", "int8")
BYTES_PER_WEIGHT = {"float32": 4, "bfloat16": 2, "int8": 1}  # for the memory check before loading


@dataclass(frozen=True)
class PortionSettings:
    variants: tuple[str, ...] = VARIANTS
    prompt_len: int = 64
    new_tokens: int = 32
    prefill_tokens: int = 256
    repeats: int = 3
    agreement_tokens: int = 64


@dataclass(frozen=True)
class PortionPoint:
    variant: str
    weight_mb: float  # what the weights occupy on the device
    decode_step_s: float  # median decode step, batch 1
    decode_cpu_step_s: float  # its median process CPU time (lab/cpu_time.py)
    prefill_s: float  # median prefill pass of `prefill_tokens`
    prefill_us_per_token: float
    greedy_prefix: int  # greedy tokens equal to float32's before the first difference
    fidelity: Fidelity  # next-token distributions against float32's on float32's continuation
    decode: Spread  # seconds: each repeat's median decode step
    prefill: Spread  # seconds: each repeat's prefill pass


@dataclass(frozen=True)
class PortionResult:
    settings: PortionSettings
    points: list[PortionPoint]
    sample: Sample  # the int8 decode run, for the inspector (its trace counts int8 bytes, engine/costs.py)
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def point(self, variant: str) -> PortionPoint:
        return next(p for p in self.points if p.variant == variant)

    @property
    def decode_speedup(self) -> float:
        """float32 decode step / int8 decode step: how many times faster int8 ladles."""
        return self.point("float32").decode_step_s / self.point("int8").decode_step_s

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for p in self.points:
            row = {k: v for k, v in asdict(p).items() if k not in ("decode", "prefill", "fidelity")}
            row.update(kl_vs_float32=p.fidelity.kl_mean, top1_vs_float32=p.fidelity.top1,
                       ppl_ratio_vs_float32=p.fidelity.ppl_ratio)  # fmt: skip
            row.update(decode_low_s=p.decode.low, decode_high_s=p.decode.high, prefill_low_s=p.prefill.low,
                       prefill_high_s=p.prefill.high, repeats=p.decode.n)  # fmt: skip
            rows.append(row)
        return pd.DataFrame(rows)


def check(engine, s: PortionSettings) -> None:
    """Refuse settings that cannot run, in one line naming the limit."""
    unknown = [v for v in s.variants if v not in VARIANTS]
    if unknown or not {"float32", "int8"} <= set(s.variants):
        raise EngineError(f"smaller portions: variants must include float32 and int8, from {', '.join(VARIANTS)}")
    if s.new_tokens < 2 or s.repeats < 1:
        raise EngineError(f"smaller portions: need new_tokens >= 2 and repeats >= 1 (got {s.new_tokens}, {s.repeats})")
    check_fits(engine, s.prompt_len, max(s.new_tokens, s.agreement_tokens), "smaller portions")
    check_fits(engine, s.prefill_tokens, 1, "smaller portions")

    need = engine.info.n_params * sum(BYTES_PER_WEIGHT[v] for v in s.variants)
    free = available_memory(engine.device)
    if need > free // 2:
        raise EngineError(f"smaller portions: the {len(s.variants)} copies need {need / 1e9:.1f} GB of weights; "
                          f"half of the {free / 1e9:.1f} GB free is the limit")  # fmt: skip


def load_variants(engine, variants) -> dict:
    """This model in each precision; the engine the page already has serves its own variant."""

    info, out = engine.info, {}
    mine = "int8" if getattr(info, "quant", None) == "int8" else info.dtype
    for v in variants:
        if v == mine:
            out[v] = engine
        else:
            quant = {"dtype": "float32", "quant": "int8"} if v == "int8" else {"dtype": v}
            out[v] = Engine.load(info.name, device=str(engine.device), **quant)
    return out


def run_portions(engine, settings: PortionSettings, on_progress: ProgressFn | None = None) -> PortionResult:
    """Decode step, prefill and greedy agreement for each weight precision, interleaved."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    s = settings
    check(engine, s)
    variants = list(dict.fromkeys(s.variants))
    repeats = max(MIN_REPEATS, s.repeats)
    tracker = ProgressTracker([1] * (len(variants) * (repeats + 2)), on_progress)
    engines = load_variants(engine, variants)
    short, long = [prompt_ids(engine, s.prompt_len)], [prompt_ids(engine, s.prefill_tokens)]
    steps = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    pre = {v: [] for v in variants}
    runs = {}
    for v in variants:  # warm-up: every variant's shapes once, untimed (a GPU's first call is slow)
        engines[v].generate(short, max_new_tokens=2, stop_at_eos=False)
        engines[v].generate(long, max_new_tokens=1, stop_at_eos=False)
        tracker.step(f"{v}: loaded and warmed up")
    for r in range(repeats):
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            timed = generate_timed(engines[v], short, max_new_tokens=s.new_tokens, temperature=0.0, stop_at_eos=False)
            runs[v] = timed.result
            steps[v].append(median_of([st.seconds for st in timed.result.trace.decode_steps]))
            cpu[v].append(median_of(timed.decode_cpu_s))
            pre[v].append(engines[v].generate(long, max_new_tokens=1, stop_at_eos=False).trace.prefill.seconds)
            tracker.step(f"{v}: decode step {median_of(steps[v]) * 1e3:.2f} ms")
    greedy = {v: engines[v].generate(short, max_new_tokens=s.agreement_tokens, stop_at_eos=False).tokens[0]
              for v in variants}  # fmt: skip
    text = [short[0] + greedy["float32"]]  # float32's own continuation, scored in its second half
    fid = {v: measure(engines["float32"], engines[v], text) for v in variants}
    for v in variants:
        tracker.step(f"{v}: greedy tokens and next-token distributions compared with float32")
    points = [point(v, engines[v], steps[v], cpu[v], pre[v], s, greedy[v], greedy["float32"], fid[v]) for v in variants]
    result = PortionResult(s, points, sample_of(runs["int8"], "int8 weights"), [], str(engine.device),
                           watch.finish())  # fmt: skip
    return replace(result, notes=notes(result, engine))


def point(v, eng, steps, cpu, pre, s, tokens, reference, fidelity) -> PortionPoint:
    decode, prefill = spread_of(steps), spread_of(pre)
    return PortionPoint(v, eng.info.weight_bytes / 1e6, decode.median, median_of(cpu), prefill.median,
                        prefill.median / s.prefill_tokens * 1e6, prefix_agreement(reference, tokens), fidelity,
                        decode, prefill)  # fmt: skip


def faster_finding(what: str, ref: Spread, other: Spread, machine: Machine | None) -> str:
    """int8 against float32 on one measure, said only where the repeats' ranges do not overlap."""
    if clearly_apart(ref, other):
        word = "faster" if other.median < ref.median else "slower"
        return f"{what}: int8 is {word} than float32 by more than the repeats vary"
    if machine is None:
        return f"{what}: too noisy to say whether int8 is faster than float32"
    return machine.too_noisy(f"whether int8's {what} is faster than float32's")


def notes(r: PortionResult, engine) -> list[str]:
    f32, i8 = r.point("float32"), r.point("int8")
    out = [
        f"median decode step: float32 {f32.decode_step_s * 1e3:.2f} ms, int8 {i8.decode_step_s * 1e3:.2f} ms "
        f"(float32 / int8 = {r.decode_speedup:.2f}x) for {f32.weight_mb / i8.weight_mb:.1f}x fewer weight bytes",
        f"prefill of {r.settings.prefill_tokens} tokens: float32 {f32.prefill_s * 1e3:.1f} ms, "
        f"int8 {i8.prefill_s * 1e3:.1f} ms ({f32.prefill_s / i8.prefill_s:.2f}x)",
        f"greedy tokens equal to float32's before the first difference: int8 {i8.greedy_prefix} of "
        f"{r.settings.agreement_tokens}" + ("" if engine.info.trained else " (random weights: near-ties flip early)"),
        f"int8 against float32 on float32's own continuation ({i8.fidelity.positions} positions), as llama.cpp "
        f"measures its quants: KL divergence {i8.fidelity.kl_mean:.4f} (99th percentile {i8.fidelity.kl_p99:.4f}), "
        f"the same most likely token at {100 * i8.fidelity.top1:.1f} % of positions, perplexity ratio "
        f"{i8.fidelity.ppl_ratio:.4f}",
    ]
    out += [faster_finding("decode step", f32.decode, i8.decode, r.machine),
            faster_finding("prefill", f32.prefill, i8.prefill, r.machine)]  # fmt: skip
    if "bfloat16" in r.settings.variants:
        b16 = r.point("bfloat16")
        out.insert(2, f"against bfloat16 (the same arithmetic as int8's prefill): decode {b16.decode_step_s * 1e3:.2f}"
                      f" ms ({b16.decode_step_s / i8.decode_step_s:.2f}x int8's), prefill {b16.prefill_s * 1e3:.1f} ms")  # fmt: skip
    return out


# -- figures --------------------------------------------------------------------------------------


def portions_figures(result, guess: float | None = None) -> list[go.Figure]:
    df = result.to_frame()
    decode = go.Figure(go.Bar(x=df.variant, y=df.decode_step_s * 1e3, marker_color=POT, name="decode step (ms)",
                              error_y=error_bars([p.decode for p in result.points], 1e3), text=[f"{v:.2f} ms" for v in df.decode_step_s * 1e3], textposition="outside"))  # fmt: skip
    if guess is not None:
        decode.add_trace(guess_marker("int8", result.point("float32").decode_step_s * 1e3 / guess, f"your guess: {guess:g}x"))
    decode.update_yaxes(title="decode step, batch 1 (ms)", rangemode="tozero")
    prefill = go.Figure(go.Bar(x=df.variant, y=df.prefill_s * 1e3, marker_color=WOK, name="prefill (ms)",
                               error_y=error_bars([p.prefill for p in result.points], 1e3), text=[f"{v:.1f} ms" for v in df.prefill_s * 1e3], textposition="outside"))  # fmt: skip
    prefill.update_yaxes(title=f"prefill of {result.settings.prefill_tokens} tokens (ms)", rangemode="tozero")
    # The spread's meaning goes in the title, which wraps to its own rows; a long axis title ran into it.
    return [finish(decode, f"Smaller portions: the soup pot ladles faster when it carries fewer bytes ({SPREAD_LEGEND})"),
            finish(prefill, f"The wok: fewer bytes do not make it toss faster ({SPREAD_LEGEND})")]  # fmt: skip


# -- the experiment -------------------------------------------------------------------------------


def settings_form(ui, info) -> PortionSettings:
    bf16 = ui.toggle("Also bfloat16 (the same arithmetic as int8's prefill)", value=True, key="portions-bf16")
    new_tokens = ui.slider("New tokens per run", 4, 64, 32, key="portions-new")
    longest = min(1024, info.max_context - 1)
    prefill_tokens = ui.slider("Prefill prompt (tokens)", 16, longest, min(256, longest), key="portions-prefill")
    repeats = ui.slider("Repeats (the median is drawn, with the range as a bar)", 3, 7, 3, key="portions-repeats")
    variants = VARIANTS if bf16 else ("float32", "int8")
    return PortionSettings(variants=variants, new_tokens=new_tokens, prefill_tokens=prefill_tokens, repeats=repeats,
                           prompt_len=min(64, info.max_context // 4), agreement_tokens=min(64, info.max_context // 2))  # fmt: skip


EXPERIMENT = Experiment(
    key="portions",
    title="Smaller portions: int8 weights in the soup pot and the wok",
    nav_title="Smaller portions: int8 weights",
    icon=":material/compress:",
    kitchen="The soup pot waits on the pantry: every spoonful needs the whole pantry carried to the stove. Pack "
    "it in smaller boxes and each trip is shorter, so the ladle comes faster, if the trip was the slow part. "
    "The wok was busy tossing, not waiting for the pantry: smaller boxes do not make it toss faster.",
    engineering="A batch-1 decode step reads every weight for two FLOPs each, so its time follows bytes: int8 "
    "weights (one byte, a scale per 32 weights, as llama.cpp's Q8_0) read 3.6x fewer than float32. Prefill does hundreds of FLOPs "
    "per weight byte, so bytes do not decide it. Our int8 prefill multiplies in bfloat16: compare it with the "
    "bfloat16 row, which does the same arithmetic.",
    predict=Prediction(
        question="How many times faster is one int8 decode step than a float32 one on this model?",
        unit="x",
        min_value=0.25,
        max_value=8.0,
        step=0.25,
        answer=lambda r: r.decode_speedup,
    ),
    form=settings_form,
    run=run_portions,
    figures=portions_figures,
    record=lambda info: PortionSettings(
        prompt_len=min(64, info.max_context // 4), agreement_tokens=min(64, info.max_context // 2),
        prefill_tokens=min(256, info.max_context - 1),
    ),  # fmt: skip
    story=StoryLink(
        ":material/compress: Smaller portions",
        "**Quantized weights**: int8 weights are a quarter of float32's bytes. Decode, which is bound by the bytes it "
        "reads, gets faster; prefill, bound by arithmetic, does not.",
        "Lab: smaller portions (int8 weights)",
    ),
    verdict=decode_verdict,
    model=ASSISTANT,  # the pot reads its weights from memory only when they do not fit in a cache
)
