"""Turning the last position's logits into the next token: greedy, temperature, top-k, top-p.

Why a per-request `torch.Generator`: the same seed must give the same tokens no matter what other
requests ran before, so the lab can repeat an experiment exactly. Greedy (temperature 0) ignores it.

Worked example: logits [2.0, 1.0, 0.5, -1.0] with temperature 0.5 become [4, 2, 1, -2]; top_k=2
keeps [4, 2]; softmax gives [0.88, 0.12]; top_p=0.8 then keeps only the first (its mass 0.88
already reaches 0.8), so the draw is certain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import EngineError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0  # 1.0 = no nucleus cut

    def check(self) -> None:
        if not self.temperature >= 0:
            raise EngineError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise EngineError(f"top_k must be >= 0, 0 meaning no limit (got {self.top_k})")
        if not 0 < self.top_p <= 1:
            raise EngineError(f"top_p must be in (0, 1] (got {self.top_p})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row; the rest become -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of top tokens whose probability mass reaches p (always >= 1 token)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum - sorted_logits.softmax(dim=-1) >= p  # mass before this token already reached p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """logits (B, V) -> next token ids (B,)."""
    logits = logits.float()
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = filter_top_p(filter_top_k(logits / params.temperature, params.top_k), params.top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def skip_draws(generator: torch.Generator, draws: int, vocab: int) -> None:
    """Move a request's generator past `draws` sampled tokens: each token is one multinomial draw
    over one row of the vocabulary (`sample`), whatever the probabilities, so the same draws over
    a flat row leave the generator where a previous engine process left it."""
    flat = torch.full((1, vocab), 1.0 / vocab)  # (1, V)
    for _ in range(draws):
        torch.multinomial(flat, 1, generator=generator)
