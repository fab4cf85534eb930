"""Experiment: two kitchens -- prefill and decode in two processes, the KV cache carried between them.

Kitchen words: in one kitchen, every new order's prompt goes in the wok on the same stove as the
soup pot, and the pot waits while the wok tosses: every table already eating waits for its next
spoonful. Two kitchens: the wok in one, the pot in the other, and a runner carries each order's
prepared stock (its KV cache) across. The pot never waits for the wok again; each order pays for
the carrying instead.

Engine words: prefill/decode disaggregation (serving/two_kitchens.py). Two processes joined by
gloo, each with `threads` torch threads; one kitchen is one engine with the lab's threads.
Measured:
  handoff runs   orders one at a time: prefill, the K/V transfer (median of repeats), the first
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

from engine.errors import EngineError
from lab.progress import ProgressFn, ProgressTracker
from lab.workload import check_fits, prompt_ids
from serving.two_kitchens import (
    KitchenRun,
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
    new_tokens: int = 32
    gap_ms: int = 120  # between arrivals
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
    handoffs: list[KitchenRun]
    one: list[StreamOrder]
    two: list[StreamOrder]
    same_tokens: bool  # every order's tokens equal in both kitchens
    notes: list[str] = field(default_factory=list)

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
    import torch

    notes = [
        f"one kitchen: the lab's engine with {torch.get_num_threads()} torch threads; two kitchens: "
        f"{s.threads} thread(s) each, on the same machine",
        "two kitchens' TTFT includes the first decode step (the decode kitchen streams the order); "
        "one kitchen's first token leaves straight from the wok",
    ]
    same = all(a.tokens == b.tokens for a, b in zip(one, two, strict=True))
    return TwoKitchensResult(s, model, str(engine.info.device), per_token, formula, link, handoffs, one, two, same,
                             notes)  # fmt: skip
