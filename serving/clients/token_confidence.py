"""How sure the chef was of each token it served: the server's logprobs as a lesson.

A model does not pick a word; it scores every token in its vocabulary and the sampler draws one.
The probability it gave the token it served, exp(logprob), is how sure it was: near 1 the next
token was all but certain (the second half of a name, a line break after a speech), low where
many continuations were plausible. The Order page colours each token by it; every number is the
server's own (OpenAI's `logprobs` field), none is computed here beyond exp().
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

BANDS = ((0.9, "#1b7f3b", "sure"), (0.5, "#8a6d00", "fairly sure"), (0.0, "#b3261e", "unsure"))  # p >= floor


@dataclass(frozen=True)
class Confidence:
    tokens: int
    mean_p: float  # mean probability of the served tokens
    unsure: int  # tokens below the middle band
    least: tuple[str, float]  # the token the model was least sure of, and its probability


def summarize(pairs: list[tuple[str, float]]) -> Confidence | None:
    if not pairs:
        return None
    ps = [math.exp(lp) for _, lp in pairs]
    low = min(range(len(ps)), key=ps.__getitem__)
    return Confidence(len(ps), sum(ps) / len(ps), sum(p < BANDS[1][0] for p in ps), (pairs[low][0], ps[low]))


def band(p: float) -> tuple[str, str]:
    return next((colour, name) for floor, colour, name in BANDS if p >= floor)


def confidence_html(pairs: list[tuple[str, float]]) -> str:
    """The answer with each token underlined in its band's colour; hovering shows its probability."""
    spans = []
    for text, lp in pairs:
        p = math.exp(lp)
        colour, name = band(p)
        shown = html.escape(text).replace("\n", "↵<br>") or "∅"
        spans.append(f'<span title="p = {p:.3f} ({name})" style="border-bottom: 3px solid {colour}; '
                     f'background: {colour}1a; margin-right: 1px">{shown}</span>')  # fmt: skip
    legend = " · ".join(f'<span style="border-bottom: 3px solid {c}">{n}</span> p ≥ {f:g}' for f, c, n in BANDS)
    return f'<div style="font-family: monospace; line-height: 1.9">{"".join(spans)}</div><small>{legend}</small>'
