"""The apprentice's own station: a second, smaller model that drafts tokens for the chef to check.

Prompt lookup (engine/speculative.py `ngram_draft`) costs nothing but only guesses text it has
seen. A draft *model* guesses anything, at the price of its own decode steps. For those steps to
be cheap the apprentice keeps its own KV cache per sequence, exactly like the chef:

  one SeatPool + Runner per draft model     seats mirror the chef's (same count, same length),
                                            the draft model's K/V shape (its layers and heads)
  one Shadow per speculating sequence       its tokens and how many of them the apprentice has
                                            cached (`num_cached`), in its own seat

Each round, for every speculating sequence together (one batched pass per draft position):

  catch up + step 1   feed what the apprentice has not cached yet: its last token (1 row), or the
                      last accepted draft and the chef's bonus token (2), or the whole prompt the
                      first time (a prefill chunk); take the argmax -> d1
  steps 2..k          feed d_(j-1) as one decode row -> d_j

After the chef verifies, the shadow is rolled back to the tokens both agree on: `num_cached` falls
to the first rejected draft, so its stale K/V are simply overwritten next round (no copy, no
recompute). The draft is greedy, i.e. a deterministic function of the text so far: its proposal
distribution q is one-hot, which is exactly what `verify` assumes (accept d with p(d); on a
rejection sample p without d), so sampled outputs keep the chef's distribution.

Worked example, k = 3, the chef's text [.. a b] with b not yet cached by either model:
  shadow cached [.. a]; pass 1 feeds b -> d1, pass 2 feeds d1 -> d2, pass 3 feeds d2 -> d3
  (cached [.. a b d1 d2]); the chef accepts d1 and replaces d2 by t: text [.. a b d1 t];
  the shadow agrees up to [.. a b d1], so num_cached = len([.. a b d1]) and next round feeds t.

The draft model's KV seats live beside the chef's budget, refused at load past half the free memory
(the apprentice's are tiny: the chef's 6 layers x 4 KV heads against its 2 x 2, a sixth of the bytes
per token, 1,024 B in float32).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.errors import EngineError
from engine.kv_pool import SeatPool
from engine.limits import available_memory
from engine.loader import load_model
from engine.runner import Runner
from engine.scheduler import StepPlan, Work
from engine.speculative import ngram_draft

NGRAM = "ngram"


@dataclass
class Shadow:
    """What the apprentice holds for one of the chef's sequences (duck-types a Sequence for Runner)."""

    request_id: int
    seat: int
    tokens: list[int] = field(default_factory=list)
    num_cached: int = 0
    base: int = 0  # len(tokens) before this round's drafts: tokens[:base] are the chef's


@dataclass
class DraftCost:
    """The apprentice's work so far: forward passes and their seconds (the lab's cost ratio)."""

    passes: int = 0
    rows: int = 0  # sequences x passes: draft tokens computed
    seconds: float = 0.0


class ModelDraft:
    """One draft model with its own KV seats; proposes greedy drafts for many sequences at once."""

    def __init__(self, name: str, loaded, seats: int, seat_len: int):
        self.name, self.model, self.codec, self.info = name, loaded.model, loaded.codec, loaded.info
        self.seat_len = min(seat_len, self.model.cfg.max_context)
        self.pool = SeatPool(self.model.cfg, seats, self.seat_len, self.model.dtype, self.model.device)
        self.runner = Runner(self.model, self.pool)
        self.shadows: dict[int, Shadow] = {}  # by request id
        self.cost = DraftCost()

    def forget(self, live: set[int]) -> None:
        """Free the seats of sequences that finished, were cancelled or preempted (not in `live`)."""
        for rid in [r for r in self.shadows if r not in live]:
            self.pool.release(self.shadows.pop(rid).seat)

    def _shadow(self, seq) -> Shadow:
        """The sequence's shadow, rolled back to the tokens the apprentice and the chef agree on."""
        sh = self.shadows.get(seq.request_id)
        if sh is None:
            sh = self.shadows[seq.request_id] = Shadow(seq.request_id, self.pool.take(seq.request_id))
        agree, limit = sh.base, min(len(sh.tokens), len(seq.tokens))
        while agree < limit and sh.tokens[agree] == seq.tokens[agree]:
            agree += 1  # accepted drafts (and the chef's own tokens) match; the first rejected one does not
        sh.num_cached = min(sh.num_cached, agree)
        sh.tokens, sh.base = list(seq.tokens), len(seq.tokens)
        self.pool.note_written(sh.seat, sh.num_cached)
        return sh

    @torch.inference_mode()
    def propose(self, seqs: list, ks: list[int]) -> list[list[int]]:
        """Up to ks[i] greedy draft tokens for seqs[i], all sequences batched into max(ks) passes."""
        ks = [min(k, self.seat_len - len(s.tokens)) for s, k in zip(seqs, ks, strict=True)]
        shadows = [self._shadow(s) if k > 0 else None for s, k in zip(seqs, ks, strict=True)]
        out: list[list[int]] = [[] for _ in seqs]
        t0 = time.perf_counter()
        for j in range(max(ks, default=0)):
            active = [(i, sh) for i, sh in enumerate(shadows) if sh is not None and j < ks[i]]
            works = []
            for _, sh in active:
                n = len(sh.tokens) - sh.num_cached  # 1 in steady state; 2 after a full accept; all at first
                works.append(Work(sh, sh.num_cached, n, n == 1, True))  # type: ignore[arg-type]
            self._compact([w.seq for w in works if w.is_decode])
            res = self.runner.run(StepPlan(works))
            best = res.logits.argmax(dim=-1).tolist()  # one row per work, in res.sampled's order
            for w, tok in zip(res.sampled, best, strict=True):
                w.seq.tokens.append(tok)
            for i, sh in active:
                out[i].append(sh.tokens[-1])
            self.cost.passes += 1
            self.cost.rows += len(works)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        self.cost.seconds += time.perf_counter() - t0
        return out

    def _compact(self, decodes: list[Shadow]) -> None:
        """The Runner reads decode rows as one view: seat them in 0..B-1 (as the scheduler does)."""
        if sorted(s.seat for s in decodes) == list(range(len(decodes))):
            return
        self.pool.compact([s.seat for s in decodes])
        seat_of = {rid: seat for seat, rid in enumerate(self.pool.owner) if rid is not None}
        for sh in self.shadows.values():
            sh.seat = seat_of[sh.request_id]


class Drafter:
    """Every draft the serving path knows: prompt lookup, plus each draft model loaded so far."""

    def __init__(self, seats: int, seat_len: int):
        self.seats, self.seat_len = seats, seat_len
        self.models: dict[str, ModelDraft] = {}

    def use(self, name: str, cfg, device, dtype, codec) -> None:
        """Make `name` ready (load it the first time); refuse, in one line, a draft that cannot
        propose the chef's tokens: another vocabulary or another tokenizer."""
        if name == NGRAM or name in self.models:
            return
        if not isinstance(name, str) or not name:
            raise EngineError(f"draft must be '{NGRAM}', 'apprentice' or a model name/folder (got {name!r})")

        loaded = load_model(name, str(device), str(dtype).removeprefix("torch."))
        vocab = loaded.model.cfg.vocab_size
        if vocab != cfg.vocab_size:
            raise EngineError(f"draft '{name}' has a vocabulary of {vocab:,} ids; the model's is {cfg.vocab_size:,}")
        if codec is not None and loaded.codec is not None and codec.tok.get_vocab() != loaded.codec.tok.get_vocab():
            raise EngineError(f"draft '{name}' has another tokenizer than the model (same size, other tokens)")
        per_token = loaded.model.cfg.kv_bytes_per_token(loaded.model.dtype.itemsize)
        need = self.seats * min(self.seat_len, loaded.model.cfg.max_context) * per_token
        free = available_memory(loaded.model.device)
        if need > free // 2:
            raise EngineError(f"draft '{name}' needs {need:,} bytes of KV seats ({self.seats} x its context); "
                              f"half the free memory is {free // 2:,} (load with a smaller max_seqs)")  # fmt: skip
        self.models[name] = ModelDraft(name, loaded, self.seats, self.seat_len)

    def propose(self, seqs: list, ks: list[int], live: set[int]) -> list[list[int]]:
        """Drafts for `seqs` (each by its own `draft`), at most ks[i] tokens each."""
        for m in self.models.values():
            m.forget(live)
        out = [ngram_draft(s.tokens, k) if k > 0 and s.draft == NGRAM else [] for s, k in zip(seqs, ks, strict=True)]
        for name, m in self.models.items():
            idx = [i for i, s in enumerate(seqs) if s.draft == name and ks[i] > 0]
            if idx:
                for i, d in zip(idx, m.propose([seqs[i] for i in idx], [ks[i] for i in idx]), strict=True):
                    out[i] = d
        return out
