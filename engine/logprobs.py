"""What a served request may ask of each sampled row besides its token: log-probabilities and min_tokens.

Why here and not in sampling: both are per-request extras that most requests never ask for, so the
step calls `row_extras` only while some live request has one (`Serving.extras`), and a step of
plain requests pays nothing. The log-probabilities are the raw model's (log-softmax of the logits,
before temperature, top-p or min_tokens' mask), as vLLM returns them by default.
"""

from __future__ import annotations

import torch


def row_extras(out, extras: set[int]) -> dict[int, torch.Tensor]:
    """request id -> the log-softmax of its sampled rows, (n, V), for those asking for logprobs; then
    the EOS ids of those under their min_tokens masked out of `out.logits` (in place, before sampling)."""
    found, row = {}, 0
    for w in out.sampled:
        seq, n = w.seq, (w.length if w.draft else 1)
        if seq.request_id in extras:
            if seq.logprobs >= 0:
                found[seq.request_id] = torch.log_softmax(out.logits[row : row + n].float(), dim=-1)  # (n, V)
            if seq.n_output < seq.min_tokens and seq.stop_ids:
                out.logits[row : row + n, list(seq.stop_ids)] = float("-inf")
        row += n
    return found


def token_logprobs(rows: torch.Tensor, j: int, token: int, k: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The j-th sampled token's logprob and the k likeliest (id, logprob) of its row of `rows` (n, V)."""
    row = rows[j]  # (V,)
    if not k:
        return float(row[token]), ()
    values, ids = row.topk(k)  # (k,) each
    return float(row[token]), tuple(zip(ids.tolist(), values.tolist(), strict=True))
