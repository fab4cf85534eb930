"""A synthetic class: request lengths drawn from a distribution, arrivals from a Poisson process.

Two load generators draw the same workload: the engine's serve-bench (engine/bench/serve_bench.py,
requests straight into the scheduler) and the class kitchen's (serving/clients/loadgen.py, the same
requests over HTTP). Both report percentiles the same way, so their numbers compare.

    Dist.parse("uniform:16:128", "--prompt-len")  -> Dist("uniform", (16, 128))
    make_requests(3, 10.0, Dist.parse("64", "p"), Dist.parse("16", "o"), seed=0, vocab=100)
    -> three Requests, exponential gaps of mean 0.1 s, 64 random prompt ids, 16 new tokens each
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from engine.errors import EngineError


@dataclass(frozen=True)
class Dist:
    """A length distribution parsed from the command line (see the module docstring)."""

    kind: str
    values: tuple[int, ...]

    @classmethod
    def parse(cls, text: str, name: str) -> Dist:
        kind, _, rest = text.partition(":") if ":" in text else ("fixed", "", text)
        try:
            values = tuple(int(v) for v in rest.replace(":", ",").split(","))
        except ValueError:
            raise EngineError(f"{name} '{text}' is not a length: use 64, uniform:16:128 or choice:32,448") from None
        ok = {"fixed": len(values) == 1, "uniform": len(values) == 2 and values[0] <= values[1], "choice": values}
        if kind not in ok or not ok[kind] or min(values) < 1:
            raise EngineError(f"{name} '{text}' is not a length: use 64, uniform:16:128 or choice:32,448 (all >= 1)")
        return cls(kind, values)

    def draw(self, rng: random.Random) -> int:
        if self.kind == "uniform":
            return rng.randint(*self.values)
        return rng.choice(self.values)

    @property
    def largest(self) -> int:
        return max(self.values)


@dataclass(frozen=True)
class Request:
    arrival_s: float  # seconds after the start of the run
    prompt: list[int]
    max_new_tokens: int


def make_requests(n: int, rate: float, prompt_len: Dist, output_len: Dist, seed: int, vocab: int) -> list[Request]:
    """N requests with exponential gaps of mean 1/rate (a Poisson process) and random token ids."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        prompt = [rng.randrange(vocab) for _ in range(prompt_len.draw(rng))]
        out.append(Request(t, prompt, output_len.draw(rng)))
    return out


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p90": None, "p99": None}
    q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else [xs[0]] * 99
    return {"p50": q[49], "p90": q[89], "p99": q[98]}
