"""The apprentice chef: propose a few tokens cheaply, let the chef check them all in one pass.

Decode reads every weight to make ONE token. If someone guesses the next k tokens, the target
model can score all k + 1 positions in one pass (reading the weights once) and keep every guess
it agrees with, plus one token of its own: 1 to k + 1 tokens for the price of one step.

Drafts: prompt lookup (n-gram matching, Saxena 2023): find the most recent earlier place where
the sequence's last n tokens occurred (n = 3, then 2, then 1) and propose what followed it. No
second model; it shines when the answer copies the prompt (code edits, quotes, lists). Or a draft
model (the apprentice, or any model with the same vocabulary) decoding greedily with its own KV
seats: engine/draft.py.

Verification keeps the target's distribution exactly (Leviathan et al. 2023): accept d with
probability min(1, p(d) / q(d)), on rejection sample from max(0, p - q). Both drafts here are
deterministic functions of the text so far (lookup, or the draft model's argmax), so q is one-hot
on d, q(d) = 1: d is accepted with probability p(d); on the first rejection the token is drawn
from p with d removed (renormalised); if every draft is accepted, one more token is drawn from
the last position. (A draft model that *sampled* would need its q here; ours never samples.)
Greedy (temperature 0) reduces to "accept while the target's argmax equals the draft", so the
output is token-identical to plain decoding.

Worked example, greedy, k = 3: tokens so far [.. to be or not to], draft [be, or, not] (seen after
"to" before). The pass scores positions for [to, be, or, not]; argmax = [be, or, not, to]:
all three accepted and "to" is the bonus: 4 tokens from one pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.sampling import SamplingParams, filter_top_k, filter_top_p, sample

MAX_SPECULATE = 16


@dataclass
class SpecCounters:
    """Per request: vLLM's counters, plus acceptance per draft position."""

    drafts: int = 0  # verification rounds that had a draft
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the target agreed with
    accepted_at: list[int] = field(default_factory=list)  # accepted_at[i]: accepted at draft position i
    rejected: int = 0  # rounds that ended on a rejected draft token (the others accepted all of theirs)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification round: 1 + accepted / drafts (1.0 = no gain)."""
        return 1 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        """Per draft token, the chance the target agreed, given it got that far: accepted tokens over
        accepted + rejected (each round is a run of accepts ended by one reject, or by the draft's end)."""
        tried = self.accepted + self.rejected
        return self.accepted / tried if tried else 0.0

    def add(self, other: SpecCounters) -> None:
        """Count another request's rounds in with these (a batch's totals)."""
        self.drafts, self.drafted, self.accepted = self.drafts + other.drafts, self.drafted + other.drafted, \
            self.accepted + other.accepted  # fmt: skip
        self.rejected += other.rejected
        self.accepted_at += [0] * (len(other.accepted_at) - len(self.accepted_at))
        for i, a in enumerate(other.accepted_at):
            self.accepted_at[i] += a

    def record(self, proposed: int, accepted: int) -> None:
        self.drafts += 1
        self.rejected += accepted < proposed
        self.drafted += proposed
        self.accepted += accepted
        self.accepted_at += [0] * (proposed - len(self.accepted_at))
        for i in range(accepted):
            self.accepted_at[i] += 1


def ngram_draft(tokens: list[int], k: int, max_n: int = 3) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens."""
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # most recent first, not the tail itself
            if tokens[start : start + n] == tail:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
    return []


def verify(logits: torch.Tensor, draft: list[int], params: SamplingParams, generator: torch.Generator) -> list[int]:
    """logits (len(draft) + 1, V) of the positions [last, d_1 .. d_k] -> the tokens to append:
    the accepted drafts, then one token of the target's own."""
    if params.greedy:
        best = logits.argmax(dim=-1).tolist()
        out = []
        for i, d in enumerate(draft):
            if best[i] != d:
                return out + [best[i]]
            out.append(d)
        return out + [best[len(draft)]]
    scaled = filter_top_p(filter_top_k(logits.float() / params.temperature, params.top_k), params.top_p)
    probs = scaled.softmax(dim=-1)  # (k + 1, V)
    out = []
    for i, d in enumerate(draft):
        u = torch.rand((), generator=generator, device=probs.device)
        if u < probs[i, d]:  # accept with probability p(d) / q(d), q(d) = 1
            out.append(d)
            continue
        residual = probs[i].clone()
        residual[d] = 0.0  # max(0, p - q) for a one-hot q
        if residual.sum() <= 0:  # p was all on d: cannot happen after a rejection, kept for safety
            return out + [d]
        return out + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    return out + [int(torch.multinomial(probs[len(draft)], 1, generator=generator))]


def pass_tokens(out) -> list[list[int]]:
    """The tokens each sampled work of a pass (engine.runner.PassOutput) appends: one, sampled with
    the sequence's own settings and generator; or, for a speculating decode, the accepted drafts and
    one more (`verify`)."""
    sampled = out.sampled
    if len(sampled) == out.logits.shape[0] and all(w.seq.params.temperature == 0 for w in sampled):
        return [[t] for t in out.logits.argmax(dim=-1).tolist()]  # every row greedy, no drafts: one argmax
    best = out.logits.argmax(dim=-1).tolist() if any(w.seq.params.greedy for w in sampled) else []
    picks, row = [], 0
    for w in out.sampled:
        seq = w.seq
        if w.draft:
            picks.append(verify(out.logits[row : row + w.length], list(w.draft), seq.params, seq.generator))
            row += w.length
            continue
        picks.append([best[row]] if seq.params.greedy else [int(sample(out.logits[row : row + 1], seq.params,
                                                                           seq.generator)[0])])  # fmt: skip
        row += 1
    return picks
