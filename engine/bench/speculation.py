"""The apprentice chef, measured: decode tokens/s with and without drafts (prompt lookup, a draft model).

    python -m engine.bench.speculation --model chef --speculate 4 --new-tokens 128 --repeats 5 [--draft ngram,apprentice] [--json]

Two kinds of order, each served alone through the engine's serving path, greedy, plain and
speculating interleaved, median of repeats:

  copy    the prompt already holds the text to come: a short prompt followed by the model's own
          greedy answer to it (COPY_LEAD tokens), so what it writes next is mostly on the ticket
          (the chef is too small to copy a quote back, but it repeats its own phrases)
  fresh   random token ids, nothing to copy: drafts rarely exist or hit, the check costs a little

Decode tokens/s = (output tokens - 1) / (E2E - TTFT), from the engine's own metrics. The outputs
must be token-identical (greedy); the report says whether they were.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from engine.engine import Engine
from engine.errors import EngineError, OneLineParser
from engine.events import Done

COPY_OPENING = "KING RICHARD II:\nNow is the hour to speak of kings and crowns;\nWhat say you, cousin?\n"
COPY_LEAD = 64  # tokens of the model's own greedy answer the copy prompt holds


@dataclass(frozen=True)
class SpecTiming:
    order: str
    draft: str
    plain_tps: float
    spec_tps: float
    identical: bool
    mean_acceptance_length: float
    accepted_at: list[int]

    @property
    def speedup(self) -> float:
        return self.spec_tps / self.plain_tps


def _serve(engine: Engine, prompt, new: int, k: int, draft: str = "ngram"):
    engine.submit(prompt, new, stop_at_eos=False, speculate=k, draft=draft)
    while not engine.idle:
        for ev in engine.step():
            if isinstance(ev, Done):
                res = ev.result
    m = res.metrics
    return res, (m.output_tokens - 1) / (m.e2e_s - m.ttft_s)


def time_speculation(engine: Engine, prompt, name: str, k: int, new: int, repeats: int,
                     draft: str = "ngram") -> SpecTiming:  # fmt: skip
    _serve(engine, prompt, 8, 0), _serve(engine, prompt, 8, k, draft)  # warm-up both paths
    plain, spec, same, res = [], [], True, None
    for _ in range(repeats):
        a, tps_a = _serve(engine, prompt, new, 0)
        res, tps_b = _serve(engine, prompt, new, k, draft)
        plain.append(tps_a)
        spec.append(tps_b)
        same = same and a.tokens == res.tokens
    c = res.speculation
    return SpecTiming(name, draft, statistics.median(plain), statistics.median(spec), same, c.mean_acceptance_length,
                      c.accepted_at)  # fmt: skip


def main(argv: list[str] | None = None) -> int:

    p = OneLineParser(prog="python -m engine.bench.speculation", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="chef")
    p.add_argument("--speculate", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--draft", default="ngram", help="comma-separated drafts: ngram, apprentice, or a model")
    p.add_argument("--json", action="store_true")
    try:
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        if args.threads:

            torch.set_num_threads(args.threads)
        engine = Engine.load(args.model, policy="continuous")
        rng = random.Random(0)
        opening = engine.encode(COPY_OPENING) if engine.codec is not None else [7, 8, 9, 10]
        copy = opening + _serve(engine, opening, COPY_LEAD, 0)[0].tokens
        fresh = [rng.randrange(engine.cfg.vocab_size) for _ in range(len(copy))]
        rows = [time_speculation(engine, prompt, name, args.speculate, args.new_tokens, args.repeats, draft)
                for draft in args.draft.split(",") for name, prompt in (("copy", copy), ("fresh", fresh))]  # fmt: skip
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(r) | {"speedup": r.speedup} for r in rows]))
        return 0
    for r in rows:
        print(f"{r.order:<6} {r.draft:<10} plain {r.plain_tps:8.1f} tok/s  speculating (K={args.speculate}) {r.spec_tps:8.1f} tok/s  "
              f"x{r.speedup:.2f}  identical={r.identical}  mean acceptance length {r.mean_acceptance_length:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
