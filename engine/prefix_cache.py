"""Leftovers: a stock made once serves many dishes (prefix reuse over the KV seats).

Many orders start the same way (a house system prompt, a shared document, the same few-shot
examples). Their K/V for those tokens are identical, so computing them again is waste. Two
sources of an already-cooked prefix:

  running    a sequence still cooking: its seat holds K/V for tokens[:num_cached]
  leftovers  a finished sequence whose seat was not needed yet: kept, least recently finished
             first to go, until a seat or KV memory is needed (then evicted, never preempting
             anyone for it)

When a request is admitted, the longest common token prefix with any source is found (token by
token: seats have no blocks, so a prefix need not fill a block). A leftover's seat is adopted as
it is (no copy); a running sequence's prefix is copied into the new seat once (its K/V bytes,
far cheaper than a prefill pass over them). At least the prompt's last token is always computed,
since its logits give the first output token.

Worked example: a 200-token house prompt + 20 tokens of question. The first order computes 220
tokens; when it finishes its seat stays as a leftover. The next order matches 200 tokens, adopts
the seat and prefills only its own 20: queries += 220, hits += 200 (vLLM counts both in tokens).

Only a request that reuses leaves leftovers (`reuse_prefix`): one that asked to cook every prompt
token (the Kitchen's default) frees its seat, so a later order starts from an empty counter unless
its cook asked for leftovers. Each leftover remembers the request that cooked it (`origin`), so a
page can say whose order a reused prefix came from, and `clear` drops those of chosen requests.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

from engine.kv_pool import SeatPool
from engine.sequence import Sequence


@dataclass(frozen=True)
class Match:
    seat: int  # where the prefix is
    length: int  # tokens reused
    leftover: int | None  # the leftover's id when the seat is adopted; None: copied from a running seat
    origin: int = -1  # the request that cooked the prefix (a running one, or the leftover's)


class PrefixCache:
    def __init__(self, pool: SeatPool):
        self.pool = pool
        self.leftovers: OrderedDict[int, list[int]] = OrderedDict()  # id (< 0, the seat's owner) -> tokens
        self.origin: dict[int, int] = {}  # leftover id -> the request that cooked it
        self._next = -1
        self.queries = 0  # prompt tokens looked up (vLLM: prefix_cache_queries)
        self.hits = 0  # of those, tokens found cached (vLLM: prefix_cache_hits)

    @property
    def tokens_held(self) -> int:
        return sum(len(t) for t in self.leftovers.values())

    def keep(self, seq: Sequence) -> None:
        """A sequence leaves the kitchen: its seat becomes a leftover instead of free."""
        lid, self._next = self._next, self._next - 1
        self.leftovers[lid] = seq.tokens[: seq.num_cached]
        self.origin[lid] = seq.request_id
        self.pool.owner[seq.seat] = lid
        self.pool.lengths[seq.seat] = seq.num_cached

    def evict(self, keep: int | None = None) -> bool:
        """Free the oldest leftover's seat (never `keep`'s); False when there is none to free."""
        lid = next((k for k in self.leftovers if k != keep), None)
        if lid is None:
            return False
        self._drop(lid)
        return True

    def clear(self, origins: set[int] | None = None) -> int:
        """Drop the leftovers cooked by `origins` (every leftover when None); returns how many."""
        gone = [lid for lid in self.leftovers if origins is None or self.origin.get(lid) in origins]
        for lid in gone:
            self._drop(lid)
        return len(gone)

    def _drop(self, lid: int) -> None:
        del self.leftovers[lid]
        self.origin.pop(lid, None)
        self.pool.release(self.pool.owner.index(lid))

    def find(self, seq: Sequence, running: list[Sequence]) -> Match | None:
        """The longest cached prefix of `seq`'s tokens (at most all but its last token); None for a
        request that asked to compute every prompt token (`reuse_prefix=False`)."""
        if not seq.reuse_prefix:
            return None
        want, best = seq.tokens[: len(seq.tokens) - 1], None
        for other in running:
            n = _common(want, other.tokens[: other.num_cached])
            if n and (best is None or n > best.length):
                best = Match(other.seat, n, None, other.request_id)
        for lid, tokens in self.leftovers.items():
            n = _common(want, tokens)
            if n and (best is None or n > best.length):
                best = Match(self.pool.owner.index(lid), n, lid, self.origin.get(lid, -1))
        return best

    def reuse(self, seq: Sequence, match: Match | None) -> int:
        """Give `seq` its seat (adopting or copying the matched prefix); returns the seat."""
        if seq.reuse_prefix:  # a request that computes every token was not looked up
            self.queries += len(seq.tokens)
        if match is None:
            return self.take_seat(seq.request_id)
        self.hits += match.length
        seq.cached_tokens, seq.reused_from = match.length, match.origin
        if match.leftover is not None:
            del self.leftovers[match.leftover]
            self.origin.pop(match.leftover, None)
            seat = match.seat
            self.pool.owner[seat], self.pool.lengths[seat] = seq.request_id, match.length
        else:
            seat = self.take_seat(seq.request_id)
            self.pool.copy_prefix(match.seat, seat, match.length)
        seq.num_cached = match.length
        return seat

    def take_seat(self, request_id: int) -> int:
        """A free seat, evicting the oldest leftover when every seat is taken."""
        if self.pool.free_seats == 0:
            self.evict()
        return self.pool.take(request_id)


def _common(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    return len(os.path.commonprefix([a, b])) if a and b else 0
