"""Experiment: two kitchens -- prefill and decode in two processes, the KV cache carried between them.

Kitchen words: in one kitchen, every new order's prompt goes in the wok on the same stove as the
soup pot, and the pot waits while the wok tosses: every table already eating waits for its next
spoonful. Two kitchens: the wok in one, the pot in the other, and a runner carries each order's
prepared stock (its KV cache) across. The pot never waits for the wok again; each order pays for
the carrying instead.

Engine words: prefill/decode disaggregation (serving/two_kitchens.py). Two processes joined by
gloo on CPU (NCCL between two GPUs is not built), each with `threads` torch threads; one kitchen is one
engine with the lab's threads, on the lab's device.
Measured:
  handoff runs   orders one at a time: prefill, the K/V transfer (fastest of repeats), the first
                 decode step: TTFT = prefill + transfer + first decode. The link is probed from
                 4 KB to 16 MB and fitted (latency + bytes / bandwidth); each transfer is compared
                 with that prediction. KV bytes per token = 2 x layers x KV heads x head dim x bytes.
  the stream     the same orders (short and long prompts alternating, arriving `gap_ms` apart)
                 through one kitchen and through two: TTFT per order and every gap between two
                 decode tokens (ITL). In one kitchen a long arrival's prefill sits between two
                 decode steps of everyone else; in two it does not.
  what-if        transfer = KV bytes / a bandwidth the learner picks: COMPUTED, not measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from engine.errors import EngineError
from lab.experiment import Experiment, Prediction, StoryLink
from lab.noise import Machine, MachineWatch
from lab.plot_kit import GREY, POT, WOK, finish, guess_marker
from lab.progress import ProgressFn, ProgressTracker
from lab.serving_verdicts import diagnose_two_kitchens
from lab.workload import check_fits, prompt_ids
from serving.two_kitchens import (
    DisaggregatedRun,
    Link,
    StreamOrder,
    one_kitchen_stream,
    run_stream,
    run_two_kitchens,
)


@dataclass(frozen=True)
class TwoKitchensSettings:
    orders: int = 6  # in the stream, alternating short and long prompts
    short_prompt: int = 16
    long_prompt: int = 384
    new_tokens: int = 48
    gap_ms: int = 50  # between arrivals: each order is still decoding when the next two arrive
    threads: int = 1  # torch threads of each of the two kitchens


@dataclass(frozen=True)
class ItlSummary:
    kitchens: str  # "one kitchen" | "two kitchens"
    gaps: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    ttft_p50_ms: float
    ttft_max_ms: float


@dataclass(frozen=True)
class TwoKitchensResult:
    settings: TwoKitchensSettings
    model: str
    device: str
    kv_bytes_per_token: int
    kv_formula: str  # "2 x 6 layers x 4 KV heads x 32 x 4 B"
    link: Link
    handoffs: list[DisaggregatedRun]
    one: list[StreamOrder]
    two: list[StreamOrder]
    same_tokens: bool  # every order's tokens equal in both kitchens
    notes: list[str] = field(default_factory=list)
    machine: Machine | None = None  # what else ran on the engine's cores meanwhile (lab.noise)

    def handoff_frame(self) -> pd.DataFrame:
        rows = [{k: v for k, v in asdict(r).items() if k not in ("tokens", "text")} for r in self.handoffs]
        df = pd.DataFrame(rows)
        df["transfer_over_predicted"] = df.transfer_s / df.predicted_transfer_s
        return df

    def stream_frame(self) -> pd.DataFrame:
        rows = []
        for name, orders in (("one kitchen", self.one), ("two kitchens", self.two)):
            for i, o in enumerate(orders):
                row = {k: v for k, v in asdict(o).items() if k not in ("itl_s", "tokens")}
                rows.append({"kitchens": name, "order": i + 1} | row | {
                    "itl_p50_s": float(np.median(o.itl_s)) if o.itl_s else None,
                    "itl_max_s": max(o.itl_s, default=None)})  # fmt: skip
        return pd.DataFrame(rows)

    def summary(self) -> list[ItlSummary]:
        out = []
        for name, orders in (("one kitchen", self.one), ("two kitchens", self.two)):
            gaps = np.array([g for o in orders for g in o.itl_s]) * 1e3
            ttft = np.array([o.ttft_s for o in orders]) * 1e3
            out.append(ItlSummary(name, len(gaps), float(np.percentile(gaps, 50)), float(np.percentile(gaps, 99)),
                                  float(gaps.max()), float(np.median(ttft)), float(ttft.max())))  # fmt: skip
        return out

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(s) for s in self.summary()])

    @property
    def worst_gap_ratio(self) -> float:
        """The worst decode gap in one kitchen over the worst in two."""
        one, two = self.summary()
        return one.max_ms / two.max_ms if two.max_ms else 0.0


def computed_transfer_s(kv_bytes: int, bytes_per_s: float) -> float:
    """The what-if: carrying time if the link moved `bytes_per_s`, latency ignored. Computed, not measured."""
    return kv_bytes / bytes_per_s


def check_settings(engine, s: TwoKitchensSettings) -> None:
    if not 2 <= s.orders <= 16:
        raise EngineError(f"two kitchens: the stream holds 2..16 orders (got {s.orders})")
    if s.new_tokens < 4:
        raise EngineError(f"two kitchens: new_tokens must be at least 4 (got {s.new_tokens})")
    if s.gap_ms < 0 or s.threads < 1:
        raise EngineError(f"two kitchens: gap_ms must be >= 0 and threads >= 1 (got {s.gap_ms}, {s.threads})")
    if not 1 <= s.short_prompt <= s.long_prompt:
        raise EngineError(f"two kitchens: need 1 <= short prompt <= long prompt (got {s.short_prompt}, {s.long_prompt})")
    check_fits(engine, s.long_prompt, s.new_tokens, "two kitchens")


def run_two_kitchens_lab(engine, settings: TwoKitchensSettings, on_progress: ProgressFn | None = None
                         ) -> TwoKitchensResult:  # fmt: skip
    """Handoff runs and the stream through one kitchen and through two (greedy, fixed lengths)."""
    watch = MachineWatch()  # what else uses the engine's cores while this measures
    s = settings
    check_settings(engine, s)
    model, cfg = engine.info.name, engine.cfg
    lengths = [s.short_prompt if i % 2 == 0 else s.long_prompt for i in range(s.orders)]
    orders = [(prompt_ids(engine, n, offset=7 * i), i * s.gap_ms / 1e3) for i, n in enumerate(lengths)]
    tracker = ProgressTracker([2.0, 1.0, 2.0], on_progress)
    dtype = str(engine.model.dtype).removeprefix("torch.")
    greedy = {"stop_at_eos": False}
    handoffs, link = run_two_kitchens(model, [orders[0][0], orders[1][0]], s.new_tokens, dtype, threads=s.threads,
                                      **greedy)  # fmt: skip
    tracker.step(f"handoffs: {len(handoffs)} orders carried, link fitted")
    one_kitchen_stream(engine, orders[:1], 2, **greedy)  # warm-up
    one = one_kitchen_stream(engine, orders, s.new_tokens, **greedy)
    tracker.step(f"one kitchen: {len(one)} orders")
    two = run_stream(model, orders, s.new_tokens, dtype, threads=s.threads, **greedy)
    tracker.step(f"two kitchens: {len(two)} orders")
    per_token = cfg.kv_bytes_per_token(engine.model.dtype.itemsize)
    formula = f"2 x {cfg.n_layers} layers x {cfg.n_kv_heads} KV heads x {cfg.head_dim} x {engine.model.dtype.itemsize} B"

    notes = [
        f"one kitchen: the lab's engine with {torch.get_num_threads()} torch threads; two kitchens: "
        f"{s.threads} thread(s) each, on the same machine",
        "two kitchens' TTFT includes the first decode step (the decode kitchen streams the order); "
        "one kitchen's first token leaves straight from the wok",
    ]
    same = all(a.tokens == b.tokens for a, b in zip(one, two, strict=True))
    if engine.device.type != "cpu":
        notes.insert(0, f"the two kitchens run on CPU (gloo between processes), the one kitchen on {engine.device}: "
                        "compare the shapes, not the milliseconds")  # fmt: skip
    for name, orders_of in (("one kitchen", one), ("two kitchens", two)):
        gaps = [g * 1e3 for o in orders_of for g in o.itl_s]
        notes.append(f"{name}: decode gaps p50 {np.median(gaps):.1f} ms, worst {max(gaps):.1f} ms; "
                     f"TTFT median {np.median([o.ttft_s for o in orders_of]) * 1e3:.1f} ms")  # fmt: skip
    for r in handoffs:
        notes.append(f"{r.prompt_tokens} tokens, {r.kv_bytes:,} B of K/V: transfer {r.transfer_s * 1e3:.3f} ms, "
                     f"{r.transfer_s / r.predicted_transfer_s:.2f}x the link's {link.latency_s * 1e6:.0f} us + bytes / "
                     f"{link.bytes_per_s / 1e9:.2f} GB/s; round trip exact: {r.round_trip_exact}")  # fmt: skip
    notes.append(f"tokens equal in one kitchen and two: {same}")
    return watch.stamp(TwoKitchensResult(s, model, str(engine.info.device), per_token, formula, link, handoffs, one, two, same,
                             notes))  # fmt: skip


# -- figures --------------------------------------------------------------------------------------

KITCHEN_COLOURS = {"one kitchen": WOK, "two kitchens": POT}
WHAT_IF_GBPS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)  # the slider's choices: the learner picks, nothing measured


def gaps_figure(result: TwoKitchensResult, guess: float | None = None) -> go.Figure:
    """Every gap between two decode tokens of every order: the one-kitchen spikes are the wok's passes."""
    fig = go.Figure()
    for name, orders in (("one kitchen", result.one), ("two kitchens", result.two)):
        gaps = [g * 1e3 for o in orders for g in o.itl_s]
        fig.add_trace(go.Box(y=gaps, name=name, boxpoints="all", jitter=0.4, pointpos=0,
                             marker=dict(color=KITCHEN_COLOURS[name], size=4)))  # fmt: skip
    if guess is not None:
        two = result.summary()[1]
        fig.add_trace(guess_marker("one kitchen", two.max_ms * guess, f"your guess: worst gap x{guess:g}"))
    fig.update_yaxes(title="gap between two decode tokens (ITL, ms)", type="log")
    return finish(fig, f"The pot's rhythm: every decode gap of the stream ({len(result.one)} orders)")


def ttft_figure(result: TwoKitchensResult) -> go.Figure:
    """The handoff runs' TTFT, split: the wok, the carrying, the pot's first step."""
    fig = go.Figure()
    x = [f"{r.prompt_tokens} tokens ({r.kv_bytes / 1e6:.2f} MB of K/V)" for r in result.handoffs]
    parts = (("prefill_s", "prefill (the wok)", WOK), ("transfer_s", "K/V transfer (the runner)", "#f0a202"),
             ("first_decode_s", "first decode step (the pot)", POT))  # fmt: skip
    for attr, name, colour in parts:
        ys = [getattr(r, attr) * 1e3 for r in result.handoffs]
        fig.add_trace(go.Bar(x=x, y=ys, name=name, marker_color=colour, text=[f"{v:.2f} ms" for v in ys],
                             textposition="inside"))  # fmt: skip
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="TTFT in two kitchens (ms)")
    return finish(fig, "Two kitchens' TTFT = prefill + transfer + first decode step, measured")


def link_figure(result: TwoKitchensResult) -> go.Figure:
    """The link's probes, the latency + bytes / bandwidth fitted to them, and each order's K/V transfer."""
    link, fig = result.link, go.Figure()
    sizes = sorted(link.probes)
    fig.add_trace(go.Scatter(x=sizes, y=[link.probes[b] * 1e3 for b in sizes], mode="markers", name="probe messages",
                             marker=dict(color=GREY, size=9)))  # fmt: skip
    line = np.geomspace(min(sizes), max(sizes), 40)
    fig.add_trace(go.Scatter(x=line, y=[link.predict(b) * 1e3 for b in line], mode="lines", name=(
        f"fit: {link.latency_s * 1e6:.0f} us + bytes / {link.bytes_per_s / 1e9:.2f} GB/s"), line=dict(color=GREY,
        dash="dot")))  # fmt: skip
    fig.add_trace(go.Scatter(x=[r.kv_bytes for r in result.handoffs], y=[r.transfer_s * 1e3 for r in result.handoffs],
                             mode="markers+text", name="an order's K/V, measured", marker=dict(color=POT, size=13),
                             text=[f"{r.transfer_s / r.predicted_transfer_s:.2f}x the fit" for r in result.handoffs],
                             textposition="top left"))  # fmt: skip
    fig.update_xaxes(title="bytes in one message", type="log")
    fig.update_yaxes(title="one message, ms", type="log")
    return finish(fig, "The runner between kitchens: the link measured, and the K/V against it")


def what_if_figure(result: TwoKitchensResult) -> go.Figure:
    """TTFT with the transfer COMPUTED as the measured K/V bytes / a bandwidth picked on the slider."""
    runs, fig = result.handoffs, go.Figure()
    x = [f"{r.prompt_tokens} tokens" for r in runs]
    here = round(result.link.bytes_per_s / 1e9, 2)  # this machine's fitted link, where the slider starts
    choices = sorted({*WHAT_IF_GBPS, here})
    fig.add_trace(go.Bar(x=x, y=[r.prefill_s * 1e3 for r in runs], name="prefill (measured)", marker_color=WOK))
    for gbps in choices:
        ys = [computed_transfer_s(r.kv_bytes, gbps * 1e9) * 1e3 for r in runs]
        fig.add_trace(go.Bar(x=x, y=ys, name=f"transfer at {gbps:g} GB/s (computed)", marker_color="#f0a202",
                             visible=gbps == here, text=[f"{v:.3g} ms" for v in ys]))  # fmt: skip
    fig.add_trace(go.Bar(x=x, y=[r.first_decode_s * 1e3 for r in runs], name="first decode (measured)",
                         marker_color=POT))  # fmt: skip
    steps = [dict(label=f"{g:g}" + ("*" if g == here else ""), method="update",
                  args=[{"visible": [True, *[j == i for j in range(len(choices))], True]}])
             for i, g in enumerate(choices)]  # fmt: skip
    fig.update_layout(barmode="stack", sliders=[dict(active=choices.index(here), steps=steps, currentvalue=dict(
        prefix="link bandwidth (GB/s, * = this machine's): "))])  # fmt: skip
    fig.update_yaxes(title="TTFT (ms): transfer COMPUTED, not measured")
    fig = finish(fig, "What if the kitchens were further apart?<br><sup>transfer = measured K/V bytes / the "
                      "bandwidth you pick: COMPUTED, not measured</sup>")  # fmt: skip
    return fig


# -- the experiment -------------------------------------------------------------------------------


def two_kitchens_verdict(result: TwoKitchensResult, roof=None, dtype: str | None = None):
    one, two = result.summary()
    longest = max(result.handoffs, key=lambda r: r.prompt_tokens)
    return diagnose_two_kitchens(one.max_ms / 1e3, two.max_ms / 1e3, one.p50_ms / 1e3, longest.transfer_s,
                                 longest.predicted_transfer_s, longest.ttft_s)  # fmt: skip


def settings_form(ui, info) -> TwoKitchensSettings:
    orders = ui.slider("Orders in the stream (short and long alternating)", 2, 12, 6, key="two-kitchens-orders")
    new = ui.slider("New tokens per order", 8, 64, 48, key="two-kitchens-new")
    most = max(32, info.max_context - new)
    long = ui.slider("Long prompt (tokens)", 32, most, min(384, most), key="two-kitchens-long")
    gap = ui.slider("Gap between arrivals (ms)", 10, 400, 50, key="two-kitchens-gap")
    threads = ui.slider("Torch threads per kitchen", 1, 2, 1, key="two-kitchens-threads")
    return TwoKitchensSettings(orders=orders, long_prompt=long, new_tokens=new, gap_ms=gap, threads=threads)


def kv_tables(result: TwoKitchensResult) -> dict[str, pd.DataFrame]:
    bytes_row = pd.DataFrame([{"kv_bytes_per_token": result.kv_bytes_per_token, "formula": result.kv_formula,
                               "link_latency_us": result.link.latency_s * 1e6,
                               "link_GB_per_s": result.link.bytes_per_s / 1e9}])  # fmt: skip
    return {"decode gaps": result.to_frame(), "handoffs": result.handoff_frame(), "stream": result.stream_frame(),
            "link": bytes_row}  # fmt: skip


EXPERIMENT = Experiment(
    key="two_kitchens",
    title="Two kitchens: prefill and decode apart",
    nav_title="Two kitchens: disaggregation",
    icon=":material/home_work:",
    kitchen="In one kitchen every new order's prompt goes in the wok on the same stove as the soup pot, and "
    "the pot waits while the wok tosses. Two kitchens: the wok in one, the pot in the other, and a runner "
    "carries each order's stock (its KV cache) across. The pot never waits for the wok; each order pays for "
    "the carrying instead.",
    engineering="Prefill/decode disaggregation: a prefill worker and a decode worker, two processes joined by "
    "torch.distributed (gloo), the prompt's K/V sent as one message. KV bytes per token = 2 x layers x KV "
    "heads x head dim x bytes. We split TTFT into prefill + transfer + first decode step, compare each "
    "transfer with the link's measured latency + bytes / bandwidth, and serve one stream of orders through "
    "one kitchen and through two.",
    predict=Prediction(
        question="Long orders arrive while tables are eating. Worst gap between two tokens of the tables, one "
        "kitchen divided by two kitchens: how many times?",
        unit="x",
        min_value=0.1,
        max_value=100.0,
        step=0.5,
        answer=lambda r: r.worst_gap_ratio,
    ),
    form=settings_form,
    run=run_two_kitchens_lab,
    figures=lambda r, g: [gaps_figure(r, g), ttft_figure(r), link_figure(r), what_if_figure(r)],
    record=lambda info: TwoKitchensSettings(long_prompt=min(384, info.max_context - 32)),
    story=StoryLink(
        ":material/home_work: The two pots in two kitchens, the dish carried between them",
        "**Prefill/decode disaggregation**: prefill and decode on separate workers, the KV cache transferred "
        "between them; decode is never interrupted by a prefill, and each request pays the transfer.",
        "Lab: two kitchens (disaggregation)",
    ),
    tables=kv_tables,
    verdict=two_kitchens_verdict,
    verdict_on=lambda r: f"{r.settings.orders} orders, {r.settings.short_prompt} and {r.settings.long_prompt} "
    f"tokens alternating, {r.settings.gap_ms} ms apart",
)
