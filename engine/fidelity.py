"""How faithful a quantized model is to float32: the measures llama.cpp reports for its own quants.

Why these measures: greedy text that forks after a few tokens says something is off, but not how
much, and one near-tie decides a fork. llama.cpp's `llama-perplexity --kl-divergence` compares a
quantized model's next-token distributions with float32's over every position of a text, and its
figures are the ones quantization is judged by: the KL divergence KL(P_f32 || P_quant) per position
(its mean, median, 99th percentile and maximum), how often both pick the same most likely token
("same top p"), and the ratio of the two perplexities on the text.

llama.cpp scores the second half of each context window of `ctx` tokens (the first half is there so
every scored position has at least ctx/2 tokens before it): positions ctx/2 .. ctx-2 each predict the
next token. `scored_rows` names those rows; `FidelityMeter` adds them up chunk by chunk, so the
(positions, vocab) log-probabilities of a long text never sit in memory at once.

Worked example: at one position float32 gives the next token p = (0.7, 0.2, 0.1) and int8 gives
q = (0.6, 0.3, 0.1). KL = 0.7 ln(0.7/0.6) + 0.2 ln(0.2/0.3) + 0.1 ln(0.1/0.1) = 0.027; both pick
token 0 (same top-1); if the text's next token is token 1, int8's loss there is -ln 0.3 = 1.20 against
float32's 1.61, and the perplexity ratio is exp of the mean difference of the two losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.kv_pool import SeatPool


def scored_rows(ctx: int) -> list[int]:
    """The positions of a `ctx`-token window whose next-token predictions are scored (llama.cpp's rule)."""
    return list(range(ctx // 2, ctx - 1))


def window_logits(eng, ids: list[int], rows: list[int]) -> torch.Tensor:
    """Logits (len(rows), V) float32 of one pass over `ids` (positions 0..T-1), for the rows named.

    The pass a prompt takes: the native step where it runs (engine/native.py: every row through the
    same int8 arithmetic as a decode step), else the model's forward."""
    T = len(ids)
    step = eng.native
    if step is not None and step.ready and eng.model.dtype == torch.float32:
        pool = SeatPool(eng.cfg, 1, T, torch.float32, "cpu")  # one seat, just this window
        return step.run(ids, list(range(T)), [0] * T, rows, pool)
    with torch.inference_mode():
        tokens = torch.tensor([ids], device=eng.model.device)  # (1, T)
        out = eng.model(tokens, torch.arange(T, device=tokens.device).unsqueeze(0))  # (1, T, V)
    return out[0, rows].float().cpu()


@dataclass(frozen=True)
class Fidelity:
    """One quantized model against float32 on the same text (see the module's docstring)."""

    positions: int
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    top1: float  # fraction of positions where both pick the same most likely token
    ppl: float  # the quantized model's perplexity on the text
    ppl_ref: float  # float32's

    @property
    def ppl_ratio(self) -> float:
        return self.ppl / self.ppl_ref


@dataclass
class FidelityMeter:
    """Adds up positions of (reference, quantized) logits; `result()` summarises them."""

    kl: list[torch.Tensor] = field(default_factory=list)
    same: int = 0
    nll: float = 0.0
    nll_ref: float = 0.0
    count: int = 0

    def add(self, ref_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """ref_logits, logits (N, V) at N positions; targets (N,) the tokens that came next."""
        ref = ref_logits.double().log_softmax(-1)  # (N, V)
        lp = logits.double().log_softmax(-1)  # (N, V)
        self.kl.append((ref.exp() * (ref - lp)).sum(-1).float())  # (N,) KL(ref || quant), llama.cpp's order
        self.same += int((ref.argmax(-1) == lp.argmax(-1)).sum())
        t = targets.view(-1, 1)
        self.nll -= float(lp.gather(1, t).sum())
        self.nll_ref -= float(ref.gather(1, t).sum())
        self.count += len(targets)

    def result(self) -> Fidelity:
        kl = torch.cat(self.kl).double()  # (positions,)
        n = self.count
        return Fidelity(n, float(kl.mean()), float(kl.median()), float(kl.quantile(0.99)), float(kl.max()),
                        self.same / n, math.exp(self.nll / n), math.exp(self.nll_ref / n))  # fmt: skip


def measure(ref_eng, eng, windows: list[list[int]]) -> Fidelity:
    """`eng` against `ref_eng` (the same weights in float32) over windows of token ids, each scored
    as llama.cpp scores one chunk (`scored_rows`)."""
    meter = FidelityMeter()
    for ids in windows:
        rows = scored_rows(len(ids))
        targets = torch.tensor([ids[r + 1] for r in rows])  # (N,)
        meter.add(window_logits(ref_eng, ids, rows), window_logits(eng, ids, rows), targets)
    return meter.result()


def prefix_agreement(reference: list[int], other: list[int]) -> int:
    """How many tokens `other` shares with `reference` before the first difference (at most len(reference))."""
    return next((i for i, (a, b) in enumerate(zip(reference, other, strict=False)) if a != b),
                min(len(reference), len(other)))  # fmt: skip
